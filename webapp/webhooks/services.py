"""What changes a tenant's webhook endpoints, as named actions: the API's views and the dashboard's call these.

Inputs arrive checked (the API's serializers, the dashboard's forms, both with
``net.check_literal`` for the URL); these functions keep the rules that hold
whoever asks: the endpoint count, the secret shown once, pings and redeliveries
through the outbox and within the tenant's hourly budget of them.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.errors import DomainError, ErrorCode
from webapp.tenants import hourly, locks
from webapp.tenants.models import Organization
from webapp.webhooks import delivery, outbox
from webapp.webhooks.models import EventType, WebhookEndpoint, WebhookMessage

MAX_ENDPOINTS = 20
# What a change may set (the secret changes only by a rotation).
CHANGEABLE = ("url", "events", "description", "enabled")


def create_endpoint(
    organization: Organization,
    url: str,
    events: list[str],
    *,
    description: str = "",
    enabled: bool = True,
) -> WebhookEndpoint:
    """A new endpoint with its first signing secret (``endpoint.secret``: show it this once)."""
    with transaction.atomic():
        # The tenant's row locked first: two creates at once count one after the other.
        locks.hold_tenant(organization.pk)
        if WebhookEndpoint.objects.filter(organization=organization).count() >= MAX_ENDPOINTS:
            raise DomainError(
                ErrorCode.INVALID_REQUEST, f"A tenant has at most {MAX_ENDPOINTS} webhook endpoints."
            )
        endpoint = WebhookEndpoint(
            organization=organization, url=url, events=events, description=description, enabled=enabled
        )
        delivery.rotate(endpoint)
        endpoint.save(force_insert=True)
    return endpoint


def update_endpoint(endpoint: WebhookEndpoint, changes: dict[str, Any]) -> WebhookEndpoint:
    """Set the given fields, and only those, on the row as it is now; enabling clears what the
    service's own disabling left.

    Locked and written field by field: an edit of the description made while the worker disables
    the endpoint (webapp/webhooks/delivery.py) must not write back the ``enabled`` it read before.
    """
    for name in changes:
        if name not in CHANGEABLE:
            raise ValueError(f"not a changeable endpoint field: {name}")
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        fields = list(changes)
        for name, value in changes.items():
            setattr(locked, name, value)
        if changes.get("enabled"):
            locked.disabled_reason = ""
            locked.failing_since = None
            fields += ["disabled_reason", "failing_since"]
        locked.updated_at = timezone.now()
        locked.save(update_fields=[*fields, "updated_at"])
    return locked


def delete_endpoint(endpoint: WebhookEndpoint) -> None:
    """The endpoint and its delivery log."""
    endpoint.delete()


def overlap(holder: Any, seconds: int | None) -> None:
    """A rotation's overlap other than the setting's default, when one is asked for."""
    if seconds is not None and holder.previous_secret:
        holder.previous_valid_until = timezone.now() + dt.timedelta(seconds=seconds)


def rotate_secret(endpoint: WebhookEndpoint, overlap_seconds: int | None = None) -> WebhookEndpoint:
    """A new signing secret (show it this once); the old one keeps signing for the overlap."""
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        delivery.rotate(locked)
        overlap(locked, overlap_seconds)
        locked.updated_at = timezone.now()
        locked.save()
    return locked


def _spend_manual_send(organization_id: Any) -> None:
    """Count a ping or redelivery against the tenant's hour; ``429 rate_limited`` past it.

    They are the sends a tenant makes at will: unbounded, they would fill the webhooks
    queue for everyone (each still waits within the tenant's share of the workers).
    """
    limit = settings.TTS_WEBHOOK_MANUAL_SENDS_PER_HOUR
    if not hourly.spend([(f"webhook-manual:{organization_id}", limit)]):
        wait = hourly.WINDOW_SECONDS - int(time.time()) % hourly.WINDOW_SECONDS
        raise DomainError(
            ErrorCode.RATE_LIMITED,
            f"More than {limit} pings and redeliveries in this hour for this tenant; try again in {wait} s.",
            retry_after=wait,
            extra={"limit": "webhook_manual_sends_per_hour", "webhook_manual_sends_per_hour": limit},
        )


def ping(endpoint: WebhookEndpoint, note: str = "A test event sent from the API.") -> WebhookMessage:
    """A ping message to the endpoint, sent through the outbox like any event."""
    _spend_manual_send(endpoint.organization_id)
    now = timezone.now()
    data = {"endpoint": str(endpoint.pk), "message": note}
    with transaction.atomic():
        ids = outbox.record(
            endpoint.organization_id, EventType.PING, data, subject=now.isoformat(), endpoints=[endpoint]
        )
    return WebhookMessage.objects.get(id=ids[0])


def redeliver(message: WebhookMessage) -> WebhookMessage:
    """Send a delivery again (same webhook-id); refused while its endpoint is disabled."""
    if message.endpoint is not None and not message.endpoint.enabled:
        raise DomainError(
            ErrorCode.INVALID_REQUEST, "The endpoint is disabled; enable it first (PATCH enabled: true)."
        )
    _spend_manual_send(message.organization_id)
    with transaction.atomic():
        return delivery.redeliver(message)
