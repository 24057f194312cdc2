"""Strict DRF fields, shared by every API app (tenants, speech).

Unknown fields are refused, numbers must be JSON numbers (``"12"`` and
``true`` are not counts), strings must be strings.
"""

from __future__ import annotations

import math
from typing import Any

from rest_framework import serializers

_DATETIME = serializers.DateTimeField()


def iso(value: Any) -> str | None:
    """A datetime as every response writes it (DRF's ISO 8601, in the site's time zone)."""
    return None if value is None else str(_DATETIME.to_representation(value))


class StrictCharField(serializers.CharField):
    """A string and only a string (DRF would turn 12 into "12")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictNumberField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        value = float(data)
        if not math.isfinite(value):
            self.fail("invalid")
        return float(super().to_internal_value(value))


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false`` and nothing else (DRF would take "yes", 1 and "on")."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictSerializer(serializers.Serializer):
    """Unknown fields are a 400, not silently dropped."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)
