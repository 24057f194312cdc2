"""The sentence cache's job fields (issue 33)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0009_job_engine_active_index"),
    ]

    operations = []  # type: ignore[var-annotated]
