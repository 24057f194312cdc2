"""A job records what its streams delivered, and the lease of the client waiting on it.

``delivered_chars`` / ``delivered_seconds``: the most any stream of the job handed
to a client (sentences' characters, audio seconds); a cancel, delete or disconnect
charges it. ``waiter_until``: the lease a waiting /v1/audio/speech request renews
while connected; the reaper abandons active jobs whose lease lapsed. Existing
rows: nothing delivered, no waiter.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0007_settlement_parts_and_time_limit"),
    ]

    operations = [
        migrations.AddField(
            model_name="synthesisjob",
            name="waiter_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="synthesisjob",
            name="delivered_chars",
            field=models.PositiveIntegerField(default=0, db_default=0),
        ),
        migrations.AddField(
            model_name="synthesisjob",
            name="delivered_seconds",
            field=models.FloatField(default=0.0, db_default=0.0),
        ),
        migrations.AddIndex(
            model_name="synthesisjob",
            index=models.Index(
                fields=["waiter_until"],
                condition=models.Q(status__in=["queued", "running"], waiter_until__isnull=False),
                name="speech_job_waiter_idx",
            ),
        ),
    ]
