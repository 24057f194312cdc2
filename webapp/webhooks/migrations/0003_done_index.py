"""The messages delivered or given up, by age: what housekeeping prunes past TTS_WEBHOOK_RETENTION_DAYS.

Built CONCURRENTLY (``atomic = False``): a plain CREATE INDEX would block every event's outbox write
while it reads a table months of events filled.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("webhooks", "0002_inflight_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="webhookmessage",
            index=models.Index(
                condition=models.Q(("status__in", ["delivered", "failed"])),
                fields=["created_at"],
                name="webhooks_message_done_idx",
            ),
        ),
    ]
