"""Usage kept per day and per key's month, so reports and a capped key's submit read rows, not history.

The rows are counted from the ledger's events here (a copy of ``ledger.recount_rollups``'s
statements as they stand in this version: a migration does not follow the code). Reservations that
old workers make while the upgrade rolls are not in them: ``manage.py recount_usage`` after it.
"""

import django.db.models.deletion
from django.db import migrations, models

_SETTLED = """speech_usageevent r
    LEFT JOIN speech_usageevent s ON s.job_key = r.job_key AND s.kind <> 'reserve'
    WHERE r.kind = 'reserve'"""
BACKFILL = (
    f"""INSERT INTO speech_usageday (organization_id, day, api_key_id, user_id, voice_name, source,
        jobs, reserved, charged_jobs, characters, cached_characters, fresh_characters, released)
    SELECT r.organization_id, (r.created_at AT TIME ZONE 'UTC')::date, r.api_key_id, r.user_id,
        r.voice_name, r.source, count(*), sum(r.characters),
        count(*) FILTER (WHERE s.kind = 'charge'),
        coalesce(sum(s.characters) FILTER (WHERE s.kind = 'charge'), 0),
        coalesce(sum((SELECT sum((p->>'covers')::bigint) FROM jsonb_array_elements(s.parts) p
                      WHERE p->>'kind' = 'cached')), 0),
        coalesce(sum((SELECT sum((p->>'characters')::bigint) FROM jsonb_array_elements(s.parts) p
                      WHERE p->>'kind' = 'fresh')), 0),
        coalesce(sum(GREATEST(0, r.characters - s.characters)), 0)
    FROM {_SETTLED}
    GROUP BY 1, 2, 3, 4, 5, 6""",
    f"""INSERT INTO speech_keyusage (api_key_id, period, characters)
    SELECT r.api_key_id, r.period, sum(coalesce(s.characters, r.characters))
    FROM {_SETTLED} AND r.api_key_id IS NOT NULL
    GROUP BY 1, 2""",
)


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0017_job_held_and_text_kept_indexes"),
        ("tenants", "0011_plan_dictionary_versions"),
    ]

    operations = [
        migrations.CreateModel(
            name="KeyUsage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("period", models.DateField()),
                ("characters", models.PositiveBigIntegerField(default=0)),
                (
                    "api_key",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="tenants.apikey"
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("api_key", "period"), name="one_key_usage_row")
                ],
            },
        ),
        migrations.CreateModel(
            name="UsageDay",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("api_key_id", models.UUIDField(blank=True, null=True)),
                ("user_id", models.BigIntegerField(blank=True, null=True)),
                ("voice_name", models.CharField(blank=True, default="", max_length=200)),
                ("source", models.CharField(blank=True, default="", max_length=20)),
                ("jobs", models.PositiveBigIntegerField(default=0)),
                ("reserved", models.PositiveBigIntegerField(default=0)),
                ("charged_jobs", models.PositiveBigIntegerField(default=0)),
                ("characters", models.PositiveBigIntegerField(default=0)),
                ("cached_characters", models.PositiveBigIntegerField(default=0)),
                ("fresh_characters", models.PositiveBigIntegerField(default=0)),
                ("released", models.PositiveBigIntegerField(default=0)),
                (
                    "organization",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tenants.organization",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("organization", "day", "api_key_id", "user_id", "voice_name", "source"),
                        name="one_usage_day_row",
                        nulls_distinct=False,
                    )
                ],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
