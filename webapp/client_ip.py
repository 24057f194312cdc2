"""The client's address as the edge saw it: the header Nginx sets, else the socket peer."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """The address in ``TTS_CLIENT_IP_HEADER`` (Nginx's X-Real-IP), else REMOTE_ADDR; unchecked."""
    header = str(getattr(settings, "TTS_CLIENT_IP_HEADER", "HTTP_X_REAL_IP"))
    return request.META.get(header) or request.META.get("REMOTE_ADDR") or None


def ip_from_scope(scope: dict[str, Any]) -> str | None:
    """The same address for an ASGI scope without a Django request (a WebSocket): the header, else the peer."""
    meta_name = str(getattr(settings, "TTS_CLIENT_IP_HEADER", "HTTP_X_REAL_IP"))
    wanted = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode()
    for name, value in scope.get("headers") or []:
        if name.lower() == wanted and value:
            return str(value.decode("latin-1"))
    client = scope.get("client")
    return str(client[0]) if client else None
