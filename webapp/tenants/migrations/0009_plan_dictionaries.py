"""The plan's dictionary limits (issue 34)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0008_plan_sentence_cache"),
    ]

    operations = []  # type: ignore[var-annotated]
