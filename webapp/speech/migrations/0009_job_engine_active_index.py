"""The active jobs of each engine, for KEDA's backlog count (webapp/speech/services/keda.py).

Built CONCURRENTLY, as 0006: a plain CREATE INDEX on months of job history would
block every submit while it runs; a concurrent build cannot run in a transaction.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("speech", "0008_delivered_and_waiter_lease"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="synthesisjob",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "running"])),
                fields=["engine"],
                name="speech_job_engine_active_idx",
            ),
        ),
    ]
