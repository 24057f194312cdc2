"""The tenant's live jobs (active, or holding audio), for the limits checked at every submit.

Built CONCURRENTLY: on a service with months of job history a plain CREATE
INDEX would block every submit and finish while it runs. A concurrent build
cannot run in a transaction, hence ``atomic = False``.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("speech", "0005_job_request_id"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="synthesisjob",
            index=models.Index(
                condition=models.Q(
                    ("status__in", ("queued", "running")), ("audio_bytes__gt", 0), _connector="OR"
                ),
                fields=["organization"],
                include=("status", "audio_bytes"),
                name="speech_job_org_live_idx",
            ),
        ),
    ]
