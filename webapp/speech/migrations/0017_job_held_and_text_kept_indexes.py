"""Two queries of the history made to read what is live only:

- the reaper's lapsed waiters: the old partial index held queued and running jobs, and the query asked
  for succeeded ones being handed too, so PostgreSQL read the whole table; the new one holds all three;
- text retention's due jobs: only finished jobs whose text is still kept, by tenant and age (the
  plans' tenants are joined to it).

Built and dropped CONCURRENTLY (``atomic = False``): a plain CREATE INDEX would block every submit
while it reads months of job rows.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("speech", "0016_job_timestamps_bytes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="synthesisjob",
            index=models.Index(
                condition=models.Q(
                    ("status__in", ["queued", "running", "succeeded"]), ("waiter_until__isnull", False)
                ),
                fields=["waiter_until"],
                name="speech_job_held_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="synthesisjob",
            index=models.Index(
                condition=models.Q(("status__in", ["succeeded", "failed", "canceled", "expired"]))
                & models.Q(("text", ""), _negated=True),
                fields=["organization", "finished_at"],
                name="speech_job_text_kept_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="synthesisjob", name="speech_job_waiter_idx"),
    ]
