"""Usage events carry key, voice, source and member (issue 35).

The events of jobs that still exist get them from their job; the events of
jobs deleted before this migration have nothing to copy and stay blank.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

BACKFILL = """
    UPDATE speech_usageevent e
    SET api_key_id = j.api_key_id, user_id = j.user_id, voice_name = j.voice_name, source = j.source
    FROM speech_synthesisjob j
    WHERE j.id = e.job_key
"""


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("tenants", "0010_key_lifecycle"),
        ("speech", "0012_job_webhook"),
    ]

    operations = [
        migrations.AddField(
            model_name="usageperiod",
            name="quota_level_announced",
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="usageevent",
            name="api_key",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="tenants.apikey",
            ),
        ),
        migrations.AddField(
            model_name="usageevent",
            name="user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="usageevent",
            name="voice_name",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.AddField(
            model_name="usageevent",
            name="source",
            field=models.CharField(blank=True, db_default="", default="", max_length=20),
        ),
        migrations.AddIndex(
            model_name="usageevent",
            index=models.Index(fields=["api_key", "period"], name="speech_usage_key_period_idx"),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop, elidable=True),
    ]
