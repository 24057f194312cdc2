"""Writing events to the outbox, inside the caller's transaction (the event's own).

Called by speech (a job's end, a voice's analysis, a settled charge): the rows
commit or roll back with the event, and their Celery messages go at commit.
A second call for the same event and destination (a transition retried, a
threshold checked again) writes nothing: the ``dedupe_key`` is unique.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.celery import app
from webapp.webhooks.models import EventType, WebhookEndpoint, WebhookMessage

log = logging.getLogger(__name__)

QUEUE = "webhooks"
DELIVER_TASK = "webhooks.deliver"
# The share of the month's characters at which usage.threshold is sent, once each per month.
USAGE_LEVELS = (80, 100)


def envelope(event: str, data: dict[str, Any], when: dt.datetime | None = None) -> dict[str, Any]:
    """The body every message has (Standard Webhooks' recommended shape)."""
    stamp = (when or timezone.now()).astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return {"type": event, "timestamp": stamp, "data": data}


def record(
    organization_id: Any,
    event: str,
    data: dict[str, Any],
    *,
    subject: str,
    job_url: str = "",
    endpoints: Iterable[WebhookEndpoint] | None = None,
) -> list[uuid.UUID]:
    """One message per enabled endpoint subscribed to ``event`` (and to ``job_url``); their ids.

    ``subject`` names what happened once (a job id, "<month>:<level>"): with the
    event and destination it makes the dedupe key.
    """
    if endpoints is None:
        endpoints = WebhookEndpoint.objects.filter(organization_id=organization_id, enabled=True).only(
            "id", "url", "events"
        )
    now = timezone.now()
    body = envelope(event, data, now)
    rows = [
        WebhookMessage(
            organization_id=organization_id,
            endpoint=endpoint,
            url=endpoint.url,
            event=event,
            payload=body,
            dedupe_key=f"{event}:{subject}:{endpoint.id}",
            created_at=now,
            window_start=now,
            next_attempt_at=now,
            enqueued_at=now,
        )
        for endpoint in endpoints
        if event == EventType.PING or event in (endpoint.events or [])
    ]
    if job_url:
        rows.append(
            WebhookMessage(
                organization_id=organization_id,
                url=job_url,
                event=event,
                payload=body,
                dedupe_key=f"{event}:{subject}:job",
                created_at=now,
                window_start=now,
                next_attempt_at=now,
                enqueued_at=now,
            )
        )
    if rows:
        # Usually none: a threshold is checked at every charge past it, a transition may run twice.
        known = set(
            WebhookMessage.objects.filter(dedupe_key__in=[r.dedupe_key for r in rows]).values_list(
                "dedupe_key", flat=True
            )
        )
        rows = [row for row in rows if row.dedupe_key not in known]
    if not rows:
        return []
    # A row whose key appeared meanwhile is skipped (its id then names nothing, and its send finds nothing).
    WebhookMessage.objects.bulk_create(rows, ignore_conflicts=True)
    ids = [row.id for row in rows]
    transaction.on_commit(lambda: send_soon(ids), robust=True)
    return ids


def send_soon(ids: Iterable[uuid.UUID], countdown: float | None = None) -> None:
    """A Celery message per outbox row; a broker that is down loses nothing (the sweep sends them)."""
    for message_id in ids:
        try:
            app.send_task(DELIVER_TASK, args=(str(message_id),), queue=QUEUE, countdown=countdown)
        except Exception:
            log.warning("webhook message %s not sent to the broker; the sweep will send it", message_id)


def usage_level_reached(used: int, monthly: int) -> list[int]:
    """The levels (percent of the month's characters) ``used`` has reached."""
    if monthly <= 0:
        return []
    return [level for level in USAGE_LEVELS if used * 100 >= monthly * level]


def record_usage(organization_id: Any, period: dt.date, used: int, monthly: int) -> None:
    """usage.threshold for each level reached this month (sent once per level and month)."""
    for level in usage_level_reached(used, monthly):
        data = {
            "organization": str(organization_id),
            "period": period.isoformat(),
            "percent": level,
            "characters_used": used,
            "monthly_characters": monthly,
        }
        record(organization_id, EventType.USAGE_THRESHOLD, data, subject=f"{period:%Y-%m}:{level}")
