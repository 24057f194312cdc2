"""Key caps and rotation (issue 35)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0009_plan_dictionaries"),
    ]

    operations = []  # type: ignore[var-annotated]
