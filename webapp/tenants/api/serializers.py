"""Request and response shapes of the keys API."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from webapp.api_fields import StrictCharField, StrictIntegerField, StrictSerializer
from webapp.tenants.models import KEY_EXPIRY_WARNING_DAYS, ApiKey

MAX_KEY_RATE = 1_000_000
MAX_KEY_CHARACTERS = 10**15
# Expiry warnings: a key that stops working within this many days is flagged (expires_soon).


class KeyRotateSerializer(StrictSerializer):
    overlap_seconds = StrictIntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=30 * 24 * 3600,
        help_text="How long the current secret keeps working next to the new one (0: it stops now).",
    )


class KeyCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=100, help_text="A name to tell the key by.")
    scopes = serializers.ListField(
        child=StrictCharField(max_length=50),
        required=False,
        allow_empty=False,
        max_length=len(ApiKey.ALL_SCOPES),
        help_text="Scopes the key carries; default speech:read and speech:write.",
    )
    expires_at = serializers.DateTimeField(required=False, help_text="When the key stops working (future).")
    requests_per_minute = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=MAX_KEY_RATE,
        help_text="A rate of the key's own; the lower of it and the plan's rate binds.",
    )
    monthly_characters = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=MAX_KEY_CHARACTERS,
        help_text="Characters a month this key's jobs may take (429 key_quota_exceeded past it); "
        "a key created by a key gets at most, and by default, its creator's.",
    )

    def validate_expires_at(self, value: dt.datetime) -> dt.datetime:
        if value <= timezone.now():
            raise serializers.ValidationError("Must be in the future.")
        return value


class KeySerializer(serializers.ModelSerializer):
    """A key as listed: never its secret (only the prefix that names it)."""

    user: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    parent_id = serializers.UUIDField(
        read_only=True,
        allow_null=True,
        help_text="The key that created this one (null: a person or the operator).",
    )
    expires_soon = serializers.SerializerMethodField(
        help_text=f"Usable now and expiring within {KEY_EXPIRY_WARNING_DAYS} days."
    )

    def get_expires_soon(self, key: ApiKey) -> bool:
        if key.expires_at is None or not key.is_usable():
            return False
        return key.expires_at - timezone.now() <= dt.timedelta(days=KEY_EXPIRY_WARNING_DAYS)

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "scopes",
            "user",
            "parent_id",
            "requests_per_minute",
            "monthly_characters",
            "created_at",
            "expires_at",
            "expires_soon",
            "last_used_at",
            "last_used_ip",
            "rotated_at",
            "previous_valid_until",
            "revoked_at",
        ]
        read_only_fields = fields


class NewKeySerializer(KeySerializer):
    """A key just created, with its secret: shown this once and never again."""

    secret = serializers.CharField(read_only=True, help_text="The full key; store it now.")

    class Meta(KeySerializer.Meta):
        fields = [*KeySerializer.Meta.fields, "secret"]
        read_only_fields = fields


class KeyListSerializer(serializers.Serializer):
    """The shape of ``GET /api/v1/keys`` (for the schema)."""

    results = KeySerializer(many=True)
