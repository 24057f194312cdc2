"""Sending outbox messages: fairly shared, one attempt at a time, retried with backoff, swept when lost.

A Celery message is a wake-up: it takes one due message (its own if it names one
that may go now, else the fairest) and makes one attempt. Taking is serialized by
one PostgreSQL advisory lock, so the caps are exact over every webhooks worker: at
most ``TTS_WEBHOOK_ENDPOINT_CONCURRENCY`` attempts in flight per endpoint and
``TTS_WEBHOOK_TENANT_CONCURRENCY`` per tenant, the tenant with the fewest in flight
first. A receiver that never answers holds its own tenant's share, never every
worker. Each finished attempt sends one wake-up for whatever waited behind a cap.

An attempt takes the message's lease (pending, due, no live lease), sends outside
any transaction (a slow receiver holds no row lock), and records the outcome:
delivered on a 2xx; otherwise the next attempt after ``BASE * 2^(n-1)`` seconds (at
most ``MAX``), jittered down to half of that, the last one at the end of the retry
window (24 h), after which it is failed. The backoff is set when the attempt is
taken: one cut off (its child killed at the time limit) waits it out too, and the
next take records it as a failed attempt. An endpoint with no delivered attempt
since its first failure ``DISABLE_AFTER`` ago is disabled and its tenant's owners
are mailed. ``now`` is injectable everywhere, so the tests run a day of retries in
seconds.

At least once: the wake-up is acknowledged late (a worker killed mid-send gets it
redelivered by the broker), and :func:`sweep` tops the queue up to what could be sent
now, so a wake-up lost with Redis or with its worker is replaced. The ``webhook-id``
stays the same.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import random
import secrets as secrets_module
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import Case, Count, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone
from standardwebhooks import Webhook

from webapp import outbound
from webapp.tenants.models import Membership
from webapp.webhooks import outbox
from webapp.webhooks.models import (
    JobWebhookSecret,
    SigningSecret,
    WebhookAttempt,
    WebhookEndpoint,
    WebhookMessage,
)

log = logging.getLogger(__name__)

MessageStatus = WebhookMessage.Status  # not "Status": a job's states are the lifecycle's alone (tests)
Poster = Callable[[str, bytes, dict[str, str]], outbound.Answer]
USER_AGENT = "tts-service-webhooks/1"


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets_module.token_bytes(24)).decode()


def rotate(holder: SigningSecret, now: dt.datetime | None = None) -> str:
    """A new secret; the old one keeps signing for TTS_WEBHOOK_SECRET_OVERLAP_SECONDS."""
    now = now or timezone.now()
    if holder.secret:
        holder.previous_secret = holder.secret
        holder.previous_valid_until = now + dt.timedelta(seconds=settings.TTS_WEBHOOK_SECRET_OVERLAP_SECONDS)
    holder.secret = new_secret()
    return holder.secret


def job_secret(organization_id: Any) -> JobWebhookSecret:
    """The tenant's secret for submits' own webhook URLs, made on first need."""
    row, _ = JobWebhookSecret.objects.get_or_create(
        organization_id=organization_id, defaults={"secret": new_secret()}
    )
    return row


def sign(secrets: list[str], webhook_id: str, when: dt.datetime, body: str) -> str:
    """The webhook-signature header: one ``v1,<base64>`` per secret, space separated."""
    return " ".join(Webhook(secret).sign(webhook_id, when, body) for secret in secrets)


def _holder(message: WebhookMessage) -> SigningSecret:
    return message.endpoint if message.endpoint is not None else job_secret(message.organization_id)


def backoff_seconds(attempts: int, rng: random.Random | None = None) -> float:
    """The wait before the next attempt after ``attempts`` failed ones: doubling, capped, jittered."""
    base = float(settings.TTS_WEBHOOK_RETRY_BASE_SECONDS)
    full = min(base * 2 ** max(0, attempts - 1), float(settings.TTS_WEBHOOK_RETRY_MAX_SECONDS))
    return full * (rng or random).uniform(0.5, 1.0)


def lease_seconds() -> float:
    """Longer than an attempt may take (the task's hard time limit): then another may take the message."""
    return settings.TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS + 2 * settings.TTS_WEBHOOK_READ_TIMEOUT_SECONDS + 5


# The advisory lock key of taking a message (any fixed number no other lock of the database uses).
TAKE_LOCK = 0x7777_6862  # "wwhb"
CUT_OFF = "cut off: no answer before the attempt's time limit (or its worker stopped)"


def _in_flight(now: dt.datetime) -> tuple[Counter[Any], Counter[Any]]:
    """Attempts holding a live lease, per endpoint and per tenant."""
    leased = WebhookMessage.objects.filter(status=MessageStatus.PENDING, lease_until__gte=now)
    by_endpoint: Counter[Any] = Counter()
    by_tenant: Counter[Any] = Counter()
    for endpoint_id, organization_id in leased.values_list("endpoint_id", "organization_id"):
        if endpoint_id is not None:
            by_endpoint[endpoint_id] += 1
        by_tenant[organization_id] += 1
    return by_endpoint, by_tenant


def _sendable(
    now: dt.datetime, by_endpoint: Counter[Any], by_tenant: Counter[Any]
) -> QuerySet[WebhookMessage]:
    """Due messages no attempt holds, whose endpoint and tenant are under their caps."""
    full_endpoints = [e for e, n in by_endpoint.items() if n >= settings.TTS_WEBHOOK_ENDPOINT_CONCURRENCY]
    full_tenants = [t for t, n in by_tenant.items() if n >= settings.TTS_WEBHOOK_TENANT_CONCURRENCY]
    return (
        WebhookMessage.objects.filter(
            Q(lease_until__isnull=True) | Q(lease_until__lt=now),
            status=MessageStatus.PENDING,
            next_attempt_at__lte=now,
        )
        .exclude(endpoint_id__in=full_endpoints)
        .exclude(organization_id__in=full_tenants)
    )


def _take(message_id: Any, now: dt.datetime) -> WebhookMessage | None:
    """A message with its lease taken, its attempt counted and its backoff set; None when none may go now.

    ``message_id`` first, when it may go; else the due message of the tenant with the
    fewest attempts in flight, the longest due first. Counted here, not when the answer
    comes: an attempt cut off still counts, backs off, and ends with the window.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TAKE_LOCK])
        by_endpoint, by_tenant = _in_flight(now)
        sendable = _sendable(now, by_endpoint, by_tenant)
        fields = ("id", "attempts", "lease_until")
        chosen = (
            sendable.filter(id=message_id).values_list(*fields).first() if message_id is not None else None
        )
        if chosen is None:
            fairest = sendable.order_by("next_attempt_at")
            if by_tenant:
                busy = Case(
                    *(When(organization_id=t, then=Value(n)) for t, n in by_tenant.items()),
                    default=Value(0),
                    output_field=IntegerField(),
                )
                fairest = sendable.annotate(busy=busy).order_by("busy", "next_attempt_at")
            chosen = fairest.values_list(*fields).first()
        if chosen is None:
            return None
        taken_id, attempts, lapsed = chosen
        lease = dt.timedelta(seconds=lease_seconds())
        WebhookMessage.objects.filter(id=taken_id).update(
            lease_until=now + lease,
            attempts=attempts + 1,
            next_attempt_at=now + lease + dt.timedelta(seconds=backoff_seconds(attempts + 1)),
        )
        message = WebhookMessage.objects.select_related("endpoint").get(id=taken_id)
        if lapsed is not None:
            # The last attempt never recorded an outcome: its lease ran out.
            WebhookAttempt.objects.create(message_id=taken_id, started_at=lapsed - lease, error=CUT_OFF)
            if message.endpoint is not None:
                _endpoint_outcome(message.endpoint.id, False, now)
                message.endpoint.refresh_from_db()
        return message


def deliver(message_id: Any = None, now: dt.datetime | None = None, post: Poster | None = None) -> str:
    """One attempt at a due message; what became of it ("delivered", "retry", "failed", "skipped").

    Any outcome but "skipped" sends a wake-up for what waited behind this attempt's caps.
    """
    now = now or timezone.now()
    message = _take(message_id, now)
    if message is None:
        return "skipped"
    try:
        return _attempt(message, now, post)
    finally:
        outbox.wake(1)


def _attempt(message: WebhookMessage, now: dt.datetime, post: Poster | None) -> str:
    endpoint = message.endpoint
    if endpoint is not None and not endpoint.enabled:
        _finish(message, MessageStatus.FAILED, error="the endpoint is disabled")
        return "failed"
    if now > _window_end(message) + dt.timedelta(seconds=lease_seconds()):
        _finish(message, MessageStatus.FAILED, error="its attempts were cut off until the retry window ended")
        return "failed"
    body = json.dumps(message.payload, separators=(",", ":"), sort_keys=True)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "webhook-id": message.webhook_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": sign(_holder(message).signing_secrets(now), message.webhook_id, now, body),
    }
    # An endpoint's URL as it is now (it may have been changed since the event); a job's own as submitted.
    url = endpoint.url if endpoint is not None else message.url
    answer = (post or outbound.post)(url, body.encode(), headers)
    return _record(message, now, answer)


def _window_end(message: WebhookMessage) -> dt.datetime:
    return message.window_start + dt.timedelta(seconds=settings.TTS_WEBHOOK_RETRY_WINDOW_SECONDS)


def _finish(message: WebhookMessage, status: str, error: str = "") -> None:
    WebhookMessage.objects.filter(id=message.id).update(
        status=status, lease_until=None, last_error=error[:500]
    )


def _record(message: WebhookMessage, now: dt.datetime, answer: outbound.Answer) -> str:
    error = answer.error or ("" if answer.ok else f"answered {answer.status}")
    with transaction.atomic():
        WebhookAttempt.objects.create(
            message_id=message.id,
            started_at=now,
            status_code=answer.status,
            latency_ms=answer.latency_ms,
            error=error[:500],
            response_excerpt=answer.excerpt,
        )
        changes: dict[str, Any] = {
            "lease_until": None,
            "last_status_code": answer.status,
            "last_error": error[:500],
        }
        if answer.ok:
            outcome = "delivered"
            changes.update(status=MessageStatus.DELIVERED, delivered_at=now)
        else:
            window_end = _window_end(message)
            if now >= window_end:
                outcome = "failed"
                changes["status"] = MessageStatus.FAILED
            else:
                # The last attempt is made at the window's end: a day of failures is a day.
                next_at = min(now + dt.timedelta(seconds=backoff_seconds(message.attempts)), window_end)
                outcome = "retry"
                changes.update(next_attempt_at=next_at)
        WebhookMessage.objects.filter(id=message.id).update(**changes)
        if message.endpoint_id is not None:
            _endpoint_outcome(message.endpoint_id, answer.ok, now)
        if outcome == "retry":
            retry_in = (changes["next_attempt_at"] - now).total_seconds()
            transaction.on_commit(lambda: outbox.send_soon([message.id], countdown=retry_in), robust=True)
    said = answer.detail or error or answer.status  # the operator's log has what the tenant is not shown
    log.info("webhook %s to %s: %s (%s)", message.webhook_id, message.url, outcome, said)
    return outcome


def _endpoint_outcome(endpoint_id: Any, ok: bool, now: dt.datetime) -> None:
    if ok:
        WebhookEndpoint.objects.filter(id=endpoint_id, failing_since__isnull=False).update(failing_since=None)
        return
    WebhookEndpoint.objects.filter(id=endpoint_id, failing_since__isnull=True).update(failing_since=now)
    cutoff = now - dt.timedelta(seconds=settings.TTS_WEBHOOK_DISABLE_AFTER_SECONDS)
    endpoint = (
        WebhookEndpoint.objects.select_for_update()
        .filter(id=endpoint_id, enabled=True, failing_since__lte=cutoff)
        .select_related("organization")
        .first()
    )
    if endpoint is None:
        return
    hours = settings.TTS_WEBHOOK_DISABLE_AFTER_SECONDS / 3600
    endpoint.enabled = False
    endpoint.disabled_reason = (
        f"Every delivery failed for {hours:g} hours (since {endpoint.failing_since:%Y-%m-%d %H:%M} UTC)."
    )
    endpoint.updated_at = now
    endpoint.save(update_fields=["enabled", "disabled_reason", "updated_at"])
    # Its waiting messages are not sent to an endpoint that is off.
    WebhookMessage.objects.filter(endpoint_id=endpoint_id, status=MessageStatus.PENDING).update(
        status=MessageStatus.FAILED, last_error="the endpoint was disabled"
    )
    org_name, reason, url = endpoint.organization.name, endpoint.disabled_reason, endpoint.url
    org_id = endpoint.organization_id
    transaction.on_commit(lambda: _mail_owners(org_id, org_name, url, reason), robust=True)
    log.warning("webhook endpoint %s disabled: %s", endpoint_id, reason)


def _mail_owners(organization_id: Any, org_name: str, url: str, reason: str) -> None:
    owners = list(
        Membership.objects.filter(organization_id=organization_id, role=Membership.Role.OWNER)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )
    if not owners:
        return
    body = (
        f"The webhook endpoint {url} of {org_name} was disabled.\n\n{reason}\n\n"
        "Fix the receiver, then enable the endpoint again (PATCH /api/v1/webhooks/<id> with "
        '{"enabled": true}) and redeliver what it missed (POST .../deliveries/<id>/redeliver).\n'
    )
    send_mail(f"Webhook endpoint disabled: {url}", body, settings.DEFAULT_FROM_EMAIL, owners)


def redeliver(message: WebhookMessage, now: dt.datetime | None = None) -> WebhookMessage:
    """Send a message again now, whatever became of it; same webhook-id, a fresh retry window."""
    now = now or timezone.now()
    WebhookMessage.objects.filter(id=message.id).update(
        status=MessageStatus.PENDING, next_attempt_at=now, window_start=now, lease_until=None
    )
    message_id = message.id
    transaction.on_commit(lambda: outbox.send_soon([message_id]), robust=True)
    return WebhookMessage.objects.get(id=message.id)


def sweep(now: dt.datetime | None = None, limit: int = 1000) -> int:
    """Top the queue's wake-ups up to what could be sent now (those lost with Redis or a worker); how many.

    What could be sent now: the due messages no attempt holds, at most each tenant's free
    share. Wake-ups already queued count against it, so a receiver that never answers
    adds none: its tenant's share stays full.
    """
    now = now or timezone.now()
    by_endpoint, by_tenant = _in_flight(now)
    per_tenant = _sendable(now, by_endpoint, by_tenant).values("organization_id").annotate(n=Count("id"))
    cap = settings.TTS_WEBHOOK_TENANT_CONCURRENCY
    wanted = sum(min(row["n"], cap - by_tenant[row["organization_id"]]) for row in per_tenant)
    missing = min(wanted, limit) - (outbox.waiting() or 0)
    if missing > 0:
        outbox.wake(missing)
    return max(0, missing)
