"""The client's address as the edge saw it: the header Nginx sets, else the socket peer."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """The address in ``TTS_CLIENT_IP_HEADER`` (Nginx's X-Real-IP), else REMOTE_ADDR; unchecked."""
    header = str(getattr(settings, "TTS_CLIENT_IP_HEADER", "HTTP_X_REAL_IP"))
    return request.META.get(header) or request.META.get("REMOTE_ADDR") or None
