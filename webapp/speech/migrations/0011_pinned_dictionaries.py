"""The dictionaries a job pins at submit (issue 34)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0010_sentence_cache"),
    ]

    operations = []  # type: ignore[var-annotated]
