"""Writing events to the outbox, inside the caller's transaction (the event's own).

Called by speech (a job's end, a voice's analysis, a settled charge): the rows
commit or roll back with the event, and their Celery messages go at commit.
A second call for the same event and destination (a transition retried, a
threshold checked again) writes nothing: the ``dedupe_key`` is unique.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from webapp.celery import app
from webapp.webhooks.models import EventType, WebhookEndpoint, WebhookMessage

log = logging.getLogger(__name__)

QUEUE = "webhooks"
DELIVER_TASK = "webhooks.deliver"


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

    def message(url: str, destination: str, endpoint: WebhookEndpoint | None = None) -> WebhookMessage:
        return WebhookMessage(
            organization_id=organization_id,
            endpoint=endpoint,
            url=url,
            event=event,
            payload=body,
            dedupe_key=f"{event}:{subject}:{destination}",
            created_at=now,
            window_start=now,
            next_attempt_at=now,
        )

    rows = [
        message(endpoint.url, str(endpoint.id), endpoint)
        for endpoint in endpoints
        if event == EventType.PING or event in (endpoint.events or [])
    ]
    if job_url:
        rows.append(message(job_url, "job"))
    if not rows:
        return []
    ids = _insert_new(rows)
    if ids:
        # Wake-ups are anyone's (each takes the fairest due message): more than the tenant may have in
        # flight would only wait; each finished attempt sends the next.
        first = ids[: settings.TTS_WEBHOOK_TENANT_CONCURRENCY]
        transaction.on_commit(lambda: send_soon(first), robust=True)
    return ids


_COLUMNS = (
    "id",
    "organization_id",
    "endpoint_id",
    "url",
    "event",
    "payload",
    "dedupe_key",
    "status",
    "attempts",
    "created_at",
    "window_start",
    "next_attempt_at",
    "last_error",
)


def _insert_new(rows: list[WebhookMessage]) -> list[uuid.UUID]:
    """Insert the rows whose dedupe key is new, in one statement; the ids of those inserted.

    A threshold is checked at every charge past it: its rows mostly exist already, and
    only new ones may get a Celery message (the ORM's ignore_conflicts cannot say which).
    """
    one = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
    values: list[Any] = []
    for row in rows:
        values += [
            row.id,
            row.organization_id,
            row.endpoint_id,
            row.url,
            row.event,
            json.dumps(row.payload),
            row.dedupe_key,
            WebhookMessage.Status.PENDING,
            0,
            row.created_at,
            row.window_start,
            row.next_attempt_at,
            "",
        ]
    sql = (
        f"INSERT INTO {WebhookMessage._meta.db_table} ({', '.join(_COLUMNS)}) "
        f"VALUES {', '.join([one] * len(rows))} ON CONFLICT (dedupe_key) DO NOTHING RETURNING id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        return [uuid.UUID(str(r[0])) for r in cursor.fetchall()]


def endpoints_sql(organization_column: str) -> str:
    """A subquery of the tenant's enabled endpoints as JSON, for a caller's own statement."""
    table = WebhookEndpoint._meta.db_table
    return (
        "(SELECT coalesce(json_agg(json_build_object('id', e.id, 'url', e.url, 'events', e.events)), '[]'::json) "
        f"FROM {table} e WHERE e.organization_id = {organization_column} AND e.enabled)"
    )


def endpoints_from(value: Any) -> list[WebhookEndpoint]:
    """The endpoints :func:`endpoints_sql` read (enough of them to write messages for)."""
    items = json.loads(value) if isinstance(value, str) else value
    return [
        WebhookEndpoint(id=uuid.UUID(str(e["id"])), url=e["url"], events=e["events"]) for e in items or []
    ]


def send_soon(ids: Iterable[uuid.UUID | None], countdown: float | None = None) -> None:
    """A wake-up per id (None: for whatever is due); a broker that is down loses nothing (the sweep sends).

    A wake-up takes its own message if that may be sent now, else the fairest due one
    (webapp/webhooks/delivery.py): the id only saves a message just written a wait.
    """
    for message_id in ids:
        args = () if message_id is None else (str(message_id),)
        try:
            app.send_task(DELIVER_TASK, args=args, queue=QUEUE, countdown=countdown)
        except Exception:
            log.warning("webhook wake-up %s not sent to the broker; the sweep will send one", message_id)


def wake(count: int) -> None:
    """``count`` wake-ups for whatever is due."""
    send_soon([None] * count)


def waiting() -> int | None:
    """Wake-ups waiting in the broker's queue; None when it cannot be asked.

    Celery sends no priority here, so the queue is the one Redis list of its name.
    """
    try:
        with app.connection_or_acquire() as connection:
            return int(connection.default_channel.client.llen(QUEUE))
    except Exception as exc:  # kombu/redis errors have no common base worth naming
        log.warning("could not count the wake-ups in queue %s: %s", QUEUE, exc)
        return None
