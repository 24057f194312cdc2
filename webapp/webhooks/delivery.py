"""Sending outbox messages: one attempt at a time, retried with backoff, swept when lost.

An attempt takes the message's lease (one conditional UPDATE: pending, due, no
live lease), sends outside any transaction (a slow receiver holds no row lock),
and records the outcome: delivered on a 2xx; otherwise the next attempt after
``BASE * 2^(n-1)`` seconds (at most ``MAX``), jittered down to half of that, the last
one at the end of the retry window (24 h), after which it is failed. An endpoint with no
delivered attempt since its first failure ``DISABLE_AFTER`` ago is disabled and
its tenant's owners are mailed. ``now`` is injectable everywhere, so the tests
run a day of retries in seconds.

At least once: the Celery message is acknowledged late (a worker killed mid-send
gets it redelivered by the broker), and :func:`sweep` re-enqueues every due row
not enqueued within ``TTS_WEBHOOK_RESEND_SECONDS``, so a message lost with Redis
or with its worker is sent again. The ``webhook-id`` stays the same.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import random
import secrets as secrets_module
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
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


def _take(message_id: Any, now: dt.datetime) -> WebhookMessage | None:
    """The message, with its lease taken and the attempt counted, if it is due and no other attempt holds it.

    Counted here, not when the answer comes: an attempt cut off (its child killed at the time
    limit by a receiver that drips its answer) still counts, and still ends with the window.
    """
    lease = now + dt.timedelta(seconds=lease_seconds())
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    with transaction.atomic():
        taken = WebhookMessage.objects.filter(
            free, id=message_id, status=MessageStatus.PENDING, next_attempt_at__lte=now
        ).update(lease_until=lease, attempts=F("attempts") + 1)
        if not taken:
            return None
        return WebhookMessage.objects.select_related("endpoint").get(id=message_id)


def deliver(message_id: Any, now: dt.datetime | None = None, post: Poster | None = None) -> str:
    """One attempt at a due message; what became of it ("delivered", "retry", "failed", "skipped")."""
    now = now or timezone.now()
    message = _take(message_id, now)
    if message is None:
        return "skipped"
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
                changes.update(next_attempt_at=next_at, enqueued_at=now)
        WebhookMessage.objects.filter(id=message.id).update(**changes)
        if message.endpoint_id is not None:
            _endpoint_outcome(message.endpoint_id, answer.ok, now)
        if outcome == "retry":
            retry_in = (changes["next_attempt_at"] - now).total_seconds()
            transaction.on_commit(lambda: outbox.send_soon([message.id], countdown=retry_in), robust=True)
    log.info("webhook %s to %s: %s (%s)", message.webhook_id, message.url, outcome, error or answer.status)
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
        status=MessageStatus.PENDING, next_attempt_at=now, window_start=now, enqueued_at=now, lease_until=None
    )
    message_id = message.id
    transaction.on_commit(lambda: outbox.send_soon([message_id]), robust=True)
    return WebhookMessage.objects.get(id=message.id)


def sweep(now: dt.datetime | None = None, limit: int = 1000) -> int:
    """Re-enqueue due messages whose Celery message may be lost (not enqueued lately); how many."""
    now = now or timezone.now()
    stale = now - dt.timedelta(seconds=settings.TTS_WEBHOOK_RESEND_SECONDS)
    due = WebhookMessage.objects.filter(
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale),
        Q(lease_until__isnull=True) | Q(lease_until__lt=now),
        status=MessageStatus.PENDING,
        next_attempt_at__lte=now,
    )
    ids: list[uuid.UUID] = list(due.order_by("next_attempt_at").values_list("id", flat=True)[:limit])
    if ids:
        WebhookMessage.objects.filter(id__in=ids).update(enqueued_at=now)
        outbox.send_soon(ids)
    return len(ids)
