"""Absolute links to the site for e-mails: from ``TTS_PUBLIC_ORIGIN``, never from the request.

A reset, invitation or confirmation link built from the request's ``Host``
goes wherever the person who asked for the mail says the site is: with a
permissive ``ALLOWED_HOSTS`` (or a host Nginx passes on), a reset link to an
attacker's address carries a valid token. The origin is a setting the
operator makes, so every mail points at the site.

This module sits at the bottom of the site's layers (settings only).
"""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse


def public_origin() -> str:
    """``TTS_PUBLIC_ORIGIN`` without a trailing slash, e.g. ``https://localhost:8443``."""
    return str(settings.TTS_PUBLIC_ORIGIN).rstrip("/")


def public_url(path: str) -> str:
    """The absolute address of ``path`` (which starts with ``/``) on the public site."""
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not a path from the site's root")
    return public_origin() + path


def public_url_for(name: str, *args: object) -> str:
    """The absolute address of the URL pattern ``name`` with ``args`` (``reverse``), for an e-mail."""
    return public_url(reverse(name, args=args))
