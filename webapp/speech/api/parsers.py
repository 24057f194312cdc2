"""A JSON parser that refuses what Python's json module would let through.

Python's ``json`` accepts ``NaN``/``Infinity`` and turns ``1e999`` into
``inf``; it also reads bodies of any size. None of that is JSON a client
should be able to send us.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from webapp.problems import too_large


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]}… is out of range")
    return value


def max_body_bytes() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 1024 * 1024)


def read_limited(stream: Any, limit: int) -> bytes:
    """Read at most ``limit`` bytes; a larger body is a 413, not a memory spike."""
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise too_large()
    return raw


def loads_strict(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"The body is not valid UTF-8 (byte {exc.start}).") from exc
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError as exc:  # also "Exceeds the limit (4300 digits)" for huge integers
        raise ParseError(f"The body is not valid JSON: {exc}") from exc


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        request = (parser_context or {}).get("request")
        limit = max_body_bytes()
        if request is not None:
            declared = request.META.get("CONTENT_LENGTH") or "0"
            if declared.isdigit() and int(declared) > limit:
                raise too_large()
        return loads_strict(read_limited(stream, limit))
