"""Realtime sessions: one row per session; its units are jobs that name it.

The jobs' index on the new column is partial (only units are in it) and built CONCURRENTLY: on a service
with months of job history a plain CREATE INDEX would block every submit while it runs, and a concurrent
build cannot run in a transaction (``atomic = False``). The column is nullable without a default: adding
it rewrites no row.
"""

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("dictionaries", "0001_initial"),
        ("speech", "0019_voice_consents"),
        ("tenants", "0012_plan_voices_need_recorded_consent"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SpeechSession",
            fields=[
                (
                    "id",
                    models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False),
                ),
                ("protocol", models.CharField(default="native", max_length=20)),
                ("voice_name", models.CharField(blank=True, max_length=200)),
                ("format", models.CharField(blank=True, max_length=10)),
                (
                    "status",
                    models.CharField(
                        choices=[("open", "Open"), ("closed", "Closed")], default="open", max_length=8
                    ),
                ),
                ("close_code", models.PositiveIntegerField(blank=True, null=True)),
                ("close_reason", models.CharField(blank=True, max_length=200)),
                ("contexts", models.PositiveIntegerField(default=0)),
                ("units", models.PositiveIntegerField(default=0)),
                ("received_chars", models.PositiveIntegerField(default=0)),
                ("charged_chars", models.PositiveIntegerField(default=0)),
                ("audio_seconds", models.FloatField(default=0.0)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("alive_until", models.DateTimeField(blank=True, null=True)),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                (
                    "api_key",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="tenants.apikey",
                    ),
                ),
                (
                    "organization",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="speech_sessions",
                        to="tenants.organization",
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="synthesisjob",
            name="session",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="unit_jobs",
                to="speech.speechsession",
            ),
        ),
        AddIndexConcurrently(
            model_name="synthesisjob",
            index=models.Index(
                condition=models.Q(("session__isnull", False)),
                fields=["session"],
                name="speech_job_session_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="speechsession",
            index=models.Index(fields=["organization", "-created_at"], name="speech_spee_organiz_2982e9_idx"),
        ),
        migrations.AddIndex(
            model_name="speechsession",
            index=models.Index(
                condition=models.Q(("status", "open")),
                fields=["organization", "api_key"],
                name="speech_session_open_idx",
            ),
        ),
    ]
