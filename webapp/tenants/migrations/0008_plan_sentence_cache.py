"""The plan's sentence cache settings (issue 33)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0007_apikey_parent"),
    ]

    operations = []  # type: ignore[var-annotated]
