"""A JSON parser that refuses what Python's json module would let through."""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"The body is not valid UTF-8 (byte {exc.start}).") from exc
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ParseError(f"The body is not valid JSON: {exc}") from exc
