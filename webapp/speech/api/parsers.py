"""A JSON parser that refuses what Python's json module would let through.

Python's ``json`` accepts ``NaN``/``Infinity`` and turns ``1e999`` into
``inf``; it also reads bodies of any size. None of that is JSON a client
should be able to send us.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from webapp.problems import too_large

# Our bodies nest two levels at most; 32 leaves room for clients' extras.
MAX_DEPTH = 32


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


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest, counted on the raw text (brackets inside strings skipped)."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def loads_strict(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"The body is not valid UTF-8 (byte {exc.start}).") from exc
    # Checked before parsing: Python's json recurses and a deep enough body is a RecursionError (a 500).
    if nesting_depth(text) > MAX_DEPTH:
        raise ParseError(f"The body nests arrays or objects deeper than {MAX_DEPTH} levels.")
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
            if declared.isascii() and declared.isdigit() and int(declared) > limit:
                raise too_large()
        return loads_strict(read_limited(stream, limit))
