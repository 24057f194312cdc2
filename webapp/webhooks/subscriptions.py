"""What the webhooks package makes of the service's events: outbox messages, in the deciding transaction.

Subscribed in ``WebhooksConfig.ready``; each handler reads its own facts (one
statement for a job's) and writes the outbox inside the transaction that
published the event, so a message exists exactly when the fact committed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from webapp.rawrows import fetch_one
from webapp.speech.models import SpeechSession, SynthesisJob, Voice
from webapp.speech.services import events
from webapp.speech.services.jobview import JobView, session_view
from webapp.speech.services.ledger import Settlement
from webapp.webhooks import outbox
from webapp.webhooks.models import EventType, WebhookEndpoint

# What a job's event needs, in one statement: the job's facts its payload shows and the tenant's enabled
# endpoints.
_JOB_FIELDS = (
    "id", "organization_id", "status", "voice_name", "format", "text_chars", "webhook_url",
    "audio_path", "duration_seconds", "error_code", "error_message", "session_id",
)  # fmt: skip
_JOB_FACTS = f"""
    SELECT {", ".join("j." + f for f in _JOB_FIELDS)}, {outbox.endpoints_sql("j.organization_id")}
    FROM {SynthesisJob._meta.db_table} j WHERE j.id = %s"""


def job_ended(event: events.JobEnded) -> None:
    """job.succeeded / job.failed / job.canceled to the tenant's endpoints and the job's own
    webhook_url; usage.threshold for each quota level its settlement crossed."""
    row = fetch_one(_JOB_FACTS, [event.job_id])
    if row is None:
        return
    *facts, endpoints_json = row
    job = SynthesisJob(**dict(zip(_JOB_FIELDS, facts, strict=True)))  # the row as read, never saved
    endpoints = outbox.endpoints_from(endpoints_json)
    if event.settlement is not None:
        _usage_levels(event.settlement, endpoints)
    if job.session_id is not None:
        return  # a realtime session's unit: the session's own event tells (a job.* per sentence would flood)
    data = JobView(job).for_webhook(settings.TTS_PUBLIC_ORIGIN)
    outbox.record(
        job.organization_id,
        f"job.{job.status}",
        data,
        subject=str(event.job_id),
        job_url=job.webhook_url,
        endpoints=endpoints,
    )


def job_settled(event: events.JobSettled) -> None:
    """A settlement apart from the job's end: usage.threshold for the levels it crossed."""
    _usage_levels(event.settlement)


def _usage_levels(settlement: Settlement, endpoints: list[WebhookEndpoint] | None = None) -> None:
    """usage.threshold for each level the settlement crossed (the ledger marks each once a month)."""
    for level in settlement.levels:
        data = {
            "organization": str(settlement.organization_id),
            "period": settlement.period.isoformat(),
            "percent": level,
            "characters_used": settlement.used,
            "monthly_characters": settlement.monthly,
        }
        subject = f"{settlement.period:%Y-%m}:{level}"
        outbox.record(
            settlement.organization_id, EventType.USAGE_THRESHOLD, data, subject=subject, endpoints=endpoints
        )


def voice_decided(event: events.VoiceDecided) -> None:
    """voice.ready / voice.rejected to the tenant's endpoints."""
    voice = Voice.objects.filter(pk=event.voice_pk).first()
    if voice is None or voice.organization_id is None:
        return  # gone meanwhile, or a built-in voice: no tenant to tell
    data: dict[str, Any] = {"id": voice.voice_id, "name": voice.name, "status": str(voice.status)}
    if voice.status == Voice.Status.REJECTED:
        data["error"] = {"code": voice.rejected_code, "message": voice.status_reason}
    outbox.record(voice.organization_id, f"voice.{voice.status}", data, subject=str(voice.pk))


def session_ended(event: events.SessionEnded) -> None:
    """session.completed to the tenant's endpoints: one per session, with its totals."""
    session = SpeechSession.objects.filter(pk=event.session_id).first()
    if session is None:
        return
    outbox.record(
        session.organization_id, EventType.SESSION_COMPLETED, session_view(session), subject=str(session.pk)
    )


def subscribe() -> None:
    events.subscribe(events.JobEnded, job_ended)
    events.subscribe(events.JobSettled, job_settled)
    events.subscribe(events.VoiceDecided, voice_decided)
    events.subscribe(events.SessionEnded, session_ended)
