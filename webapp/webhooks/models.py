"""Webhooks: a tenant's endpoints, the outbox of messages to send them, and each attempt.

The outbox row (:class:`WebhookMessage`) is written in the transaction of the
event it tells about (a job's end, a voice's analysis, a month's usage), so an
event that happened always has its message and a rolled-back one never does.
Celery messages only say "send message X"; the row is the truth, and a beat
sweep sends again what is due and was not sent (webapp/webhooks/delivery.py).
Its ``id`` is the Standard Webhooks ``webhook-id``: the same on every retry, so
a receiver drops the duplicates an at-least-once delivery makes.
"""

from __future__ import annotations

import datetime as dt
import uuid

from django.db import models
from django.utils import timezone

from webapp.tenants.models import Organization


class EventType(models.TextChoices):
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_CANCELED = "job.canceled"
    VOICE_READY = "voice.ready"
    VOICE_REJECTED = "voice.rejected"
    USAGE_THRESHOLD = "usage.threshold"
    SESSION_COMPLETED = "session.completed"
    PING = "ping"


# What an endpoint may subscribe to; ping is always delivered to the endpoint it is sent to.
SUBSCRIBABLE = [e.value for e in EventType if e != EventType.PING]
JOB_EVENTS = (EventType.JOB_SUCCEEDED, EventType.JOB_FAILED, EventType.JOB_CANCELED)


class SigningSecret(models.Model):
    """A signing secret and, while a rotation's overlap lasts, the one before it.

    Stored as it is (a signature needs the secret itself, unlike an API key's
    hash) and shown once, when it is made. During the overlap every message is
    signed with both, so a receiver still holding the old secret verifies.
    """

    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True)
    previous_valid_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def signing_secrets(self, now: dt.datetime | None = None) -> list[str]:
        when = now or timezone.now()
        secrets = [self.secret]
        if self.previous_secret and self.previous_valid_until and self.previous_valid_until > when:
            secrets.append(self.previous_secret)
        return secrets


class WebhookEndpoint(SigningSecret):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=500, blank=True)
    events = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    # Why it was turned off by the service (failing for a day); empty when enabled or turned off by the tenant.
    disabled_reason = models.CharField(max_length=500, blank=True)
    # The first failed attempt since the last delivered one: an endpoint failing this long is disabled.
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["organization", "created_at"], name="webhooks_endpoint_org_idx")]

    def __str__(self) -> str:
        return f"{self.url} ({self.organization_id})"


class JobWebhookSecret(SigningSecret):
    """The tenant's secret for messages to a submit's own ``webhook_url`` (no endpoint row names it)."""

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, primary_key=True, related_name="job_webhook_secret"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"job webhook secret of {self.organization_id}"


class WebhookMessage(models.Model):
    """One event for one destination: an endpoint, or a job's own URL (``endpoint`` null)."""

    class Status(models.TextChoices):
        PENDING = "pending"  # waiting for its next attempt (next_attempt_at)
        DELIVERED = "delivered"  # a 2xx answer
        FAILED = (
            "failed"  # given up: past the retry window, refused by the SSRF rules, or its endpoint disabled
        )

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="webhook_messages")
    endpoint = models.ForeignKey(
        WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE, related_name="messages"
    )
    url = models.URLField(max_length=2000)
    event = models.CharField(max_length=40, choices=EventType.choices)
    payload = models.JSONField()
    # One message per event and destination, whatever retries of the event's transaction happen:
    # "<event>:<subject>:<destination>" (usage.threshold: its month and level).
    dedupe_key = models.CharField(max_length=200, unique=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # Retries go on until TTS_WEBHOOK_RETRY_WINDOW_SECONDS after this (a redelivery starts it again).
    window_start = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # Read by the previous release's sweep only: kept while it may still run during a rolling update
    # (docs/scaling.md, "Upgrades"); drop it in the next release.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # Held by the attempt in progress (a worker killed mid-attempt lets it lapse).
    lease_until = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="webhooks_message_due_idx",
                condition=models.Q(status="pending"),
            ),
            models.Index(fields=["endpoint", "-created_at"], name="webhooks_message_endpoint_idx"),
            # Housekeeping's pruning of the messages done with, oldest first (prune_records).
            models.Index(
                fields=["created_at"],
                name="webhooks_message_done_idx",
                condition=models.Q(status__in=["delivered", "failed"]),
            ),
            # The attempts in flight (a handful), counted at every claim.
            models.Index(
                fields=["lease_until"],
                name="webhooks_message_leased_idx",
                condition=models.Q(status="pending", lease_until__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.url} ({self.status})"

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.id.hex}"


class WebhookAttempt(models.Model):
    message = models.ForeignKey(WebhookMessage, on_delete=models.CASCADE, related_name="attempt_log")
    started_at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    # Why there was no 2xx: refused address, connection error, timeout, or the status.
    error = models.CharField(max_length=500, blank=True)
    # The start of the answer's body, capped (webapp/outbound.py, MAX_BODY_BYTES).
    response_excerpt = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["message", "started_at"], name="webhooks_attempt_msg_idx")]

    def __str__(self) -> str:
        return f"attempt on {self.message_id} at {self.started_at}: {self.status_code or self.error}"
