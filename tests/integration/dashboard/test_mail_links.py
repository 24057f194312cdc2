"""Links in e-mails start with TTS_PUBLIC_ORIGIN, never with the Host the request named.

A reset link built from ``Host`` goes to whoever asked for the mail: with a
permissive ALLOWED_HOSTS, ``Host: evil.example`` on a reset for someone else's
address would mail them a valid token on the attacker's site.
"""

from __future__ import annotations

import re
from typing import Any, cast

import pytest
from django.core import mail
from django.test import Client, override_settings

from tests.dashboard_data import PASSWORD
from tests.integration.dashboard.conftest import client_for
from tests.redis_database import clear_cache

ORIGIN = "https://tts.example.net:9443"
EVIL = "evil.example"


@pytest.fixture(autouse=True)
def fresh_throttle(stack: Any) -> None:
    clear_cache()


def _links() -> list[str]:
    body = cast(str, mail.outbox[-1].body)
    links = re.findall(r"https?://\S+", body)
    assert links, body
    return links


def _check(links: list[str]) -> None:
    for link in links:
        assert link.startswith(ORIGIN + "/"), link
        assert EVIL not in link


@override_settings(ALLOWED_HOSTS=["*"], TTS_PUBLIC_ORIGIN=ORIGIN)
def test_password_reset_link_ignores_the_host(owner: tuple[Any, Any]) -> None:
    response = Client(HTTP_HOST=EVIL).post("/accounts/password/reset/", {"email": "owner@example.com"})
    assert response.status_code == 302
    assert mail.outbox[-1].to == ["owner@example.com"]
    _check(_links())


@override_settings(ALLOWED_HOSTS=["*"], TTS_PUBLIC_ORIGIN=ORIGIN)
def test_confirmation_links_ignore_the_host(owner: tuple[Any, Any]) -> None:
    signup = {"email": "new@example.com", "organization": "New Co", "password": PASSWORD}
    Client(HTTP_HOST=EVIL).post("/accounts/signup/", signup)
    assert mail.outbox[-1].to == ["new@example.com"]
    _check(_links())
    client = client_for(owner[0])
    client.post("/app/account/", {"email": "renamed@example.com", "password": PASSWORD}, HTTP_HOST=EVIL)
    assert mail.outbox[-1].to == ["renamed@example.com"]
    _check(_links())


def test_the_origin_setting_is_checked() -> None:
    from webapp.env import EnvError, env_origin

    assert env_origin("X", "https://localhost:8443", {}) == "https://localhost:8443"
    assert env_origin("X", "", {"X": "https://tts.example.com/"}) == "https://tts.example.com"
    for bad in ("tts.example.com", "https://tts.example.com/app", "ftp://x", "https://x:port", "https://"):
        with pytest.raises(EnvError, match="X="):
            env_origin("X", "", {"X": bad})


@override_settings(ALLOWED_HOSTS=["*"], TTS_PUBLIC_ORIGIN=ORIGIN)
def test_invitation_link_ignores_the_host(owner: tuple[Any, Any]) -> None:
    client = client_for(owner[0])
    client.post("/app/members/", {"email": "invited@example.com", "role": "member"}, HTTP_HOST=EVIL)
    assert mail.outbox[-1].to == ["invited@example.com"]
    _check(_links())
