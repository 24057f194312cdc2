"""A job's word timestamps count in its tenant's storage: their bytes on the job row, summed with its
audio through the live jobs' index.

The index gets a new name and is built CONCURRENTLY before the old one is dropped the same way: on a
service with months of job history a plain CREATE INDEX would block every submit while it runs, and a
concurrent build cannot run in a transaction (``atomic = False``). The column has a constant database
default: adding it rewrites no row.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("speech", "0015_job_synth_chars"),
    ]

    operations = [
        migrations.AddField(
            model_name="synthesisjob",
            name="timestamps_bytes",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        AddIndexConcurrently(
            model_name="synthesisjob",
            index=models.Index(
                condition=models.Q(
                    ("status__in", ("queued", "running")), ("audio_bytes__gt", 0), _connector="OR"
                ),
                fields=["organization"],
                include=("status", "audio_bytes", "timestamps_bytes"),
                name="speech_job_org_stored_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="synthesisjob", name="speech_job_org_live_idx"),
    ]
