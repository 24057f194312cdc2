"""Request and response shapes of ``/api/v1/webhooks``."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from webapp import outbound
from webapp.api_fields import StrictCharField, StrictSerializer
from webapp.webhooks.models import SUBSCRIBABLE, WebhookAttempt, WebhookEndpoint, WebhookMessage


def _checked_url(value: str) -> str:
    try:
        outbound.check_literal(value)
    except outbound.Refused as exc:
        raise serializers.ValidationError(f"Not a webhook URL: {exc}.") from None
    return value


class StrictBooleanField(serializers.BooleanField):
    """true or false, not "yes" or 1."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class EndpointWriteSerializer(StrictSerializer):
    url = StrictCharField(max_length=2000, help_text="https URL the events are POSTed to.")
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=SUBSCRIBABLE),
        allow_empty=False,
        max_length=len(SUBSCRIBABLE),
        help_text="Events to send: " + ", ".join(SUBSCRIBABLE) + " (ping is always sent when asked for).",
    )
    description = StrictCharField(max_length=500, required=False, allow_blank=True)
    enabled = StrictBooleanField(required=False, help_text="Default true; enabling clears a disabled_reason.")

    def validate_url(self, value: str) -> str:
        return _checked_url(value)

    def validate_events(self, value: list[str]) -> list[str]:
        return sorted(set(value))


class EndpointSerializer(serializers.ModelSerializer):
    """An endpoint as listed: its secret only by its first characters."""

    secret_prefix = serializers.SerializerMethodField(help_text="The start of the current signing secret.")

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "events",
            "enabled",
            "disabled_reason",
            "failing_since",
            "secret_prefix",
            "previous_valid_until",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_secret_prefix(self, obj: WebhookEndpoint) -> str:
        return obj.secret[:10]


class NewSecretEndpointSerializer(EndpointSerializer):
    """An endpoint just created or rotated, with its secret: shown this once."""

    secret = serializers.CharField(read_only=True, help_text="The signing secret (whsec_...); store it now.")

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class EndpointListSerializer(serializers.Serializer):
    results = EndpointSerializer(many=True)


class RotateSerializer(StrictSerializer):
    overlap_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=7 * 24 * 3600,
        help_text="How long the old secret keeps signing (default TTS_WEBHOOK_SECRET_OVERLAP_SECONDS).",
    )


class JobSecretSerializer(serializers.Serializer):
    secret = serializers.CharField(help_text="Signs messages to a submit's own webhook_url; shown once.")
    previous_valid_until = serializers.DateTimeField(allow_null=True)


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookAttempt
        fields = ["started_at", "status_code", "latency_ms", "error", "response_excerpt"]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    webhook_id = serializers.CharField(
        read_only=True, help_text="The webhook-id header: the same on every retry."
    )
    endpoint_id = serializers.UUIDField(
        read_only=True, allow_null=True, help_text="null: a job's own webhook_url."
    )
    attempt_log = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = WebhookMessage
        fields = [
            "id",
            "webhook_id",
            "endpoint_id",
            "url",
            "event",
            "status",
            "attempts",
            "created_at",
            "next_attempt_at",
            "delivered_at",
            "last_status_code",
            "last_error",
            "payload",
            "attempt_log",
        ]
        read_only_fields = fields


class DeliveryListSerializer(serializers.Serializer):
    results = DeliverySerializer(many=True)
