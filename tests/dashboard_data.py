"""Accounts and jobs the dashboard's integration and browser tests start from."""

from __future__ import annotations

from typing import Any

PASSWORD = "a-long-test-passphrase-9"


def make_owner(email: str = "owner@example.com", organization: str = "Acme <Sound>") -> tuple[Any, Any]:
    """A user who owns a new organisation (not an open sign-up, so no e-mail confirmation is pending)."""
    from webapp.tenants.accounts import sign_up

    return sign_up(email=email, password=PASSWORD, organization_name=organization)


def member_of(org: Any, email: str, role: str) -> Any:
    from django.contrib.auth import get_user_model

    from webapp.tenants.models import Membership

    user = get_user_model().objects.create_user(username=email, email=email, password=PASSWORD)
    Membership.objects.create(user=user, organization=org, role=role)
    return user


def make_job(
    org: Any, user: Any, text: str = "Hello there.", status: str = "succeeded", **fields: Any
) -> Any:
    """A job row as a finished (or stuck) job leaves it; no worker involved."""
    from webapp.speech.models import SynthesisJob

    defaults = {"voice_name": "en_US-joe-medium", "engine": "piper", "format": "wav", "text_chars": len(text)}
    return SynthesisJob.objects.create(
        organization=org, user=user, text=text, status=status, **{**defaults, **fields}
    )
