"""Query parameters, parsed strictly: ASCII digits only (``'²'.isdigit()`` is true)."""

from __future__ import annotations

from rest_framework.request import Request

from webapp.errors import DomainError, ErrorCode

# More digits than any range here needs: int() never sees a huge string.
MAX_DIGITS = 9


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """``?name=N`` as an int in [low, high]; anything else is a 400 ``invalid_<name>``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (0 < len(raw) <= MAX_DIGITS and raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise DomainError(
            ErrorCode(f"invalid_{name}"), f"{name} must be an integer from {low} to {high}.", field=name
        )
    return int(raw)
