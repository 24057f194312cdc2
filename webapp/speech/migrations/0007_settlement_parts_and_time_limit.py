"""A settlement lists what it charged; a job carries its own hard limit.

``UsageEvent.parts``: a charge's parts (fresh, delivered before a cancel or
disconnect). Existing charges are recorded as one fresh part of their
characters, which is what the bill counted; reservations and releases have none.

``SynthesisJob.time_limit``: the hard limit computed at submit, which a claim's
deadline counts from (it was computed again in the claim's SQL). Rows from
before stay null: a claim gives them the longest limit any job gets.
"""

from django.db import migrations, models


def record_existing_parts(apps, schema_editor):  # type: ignore[no-untyped-def]
    UsageEvent = apps.get_model("speech", "UsageEvent")
    for event in UsageEvent.objects.filter(kind="charge", characters__gt=0).iterator():
        event.parts = [{"kind": "fresh", "characters": event.characters}]
        event.save(update_fields=["parts"])


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0006_job_live_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="usageevent",
            name="parts",
            field=models.JSONField(blank=True, default=list, db_default=[]),
        ),
        migrations.AddField(
            model_name="synthesisjob",
            name="time_limit",
            field=models.DurationField(blank=True, null=True),
        ),
        migrations.RunPython(record_existing_parts, migrations.RunPython.noop),
    ]
