"""A submit's own webhook URL (issue 34)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0011_pinned_dictionaries"),
    ]

    operations = []  # type: ignore[var-annotated]
