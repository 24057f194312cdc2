"""Failed log-ins through the real edge: Nginx sets the client address, gunicorn's Django counts.

Issue 31, finding 5: six wrong passwords from 127.0.0.3 must not keep the
right one from 127.0.0.4 out, and guessing one user name from several
addresses slows those addresses down (429 with Retry-After) while a fresh
address still gets in. Each client speaks from its own loopback address, as a
remote client would; the forwarding headers it sends are replaced by Nginx.
An Nginx of its own with a loose "login" zone, so that the zone (tested in
test_nginx_rate_limits.py) does not answer before Django does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.e2e.nginx_helpers import NginxInstance, client, start_nginx
from tests.stack import TestStack as Stack

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
CSRF_RE = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(scope="module")
def edge(web: Stack) -> Iterator[NginxInstance]:
    loose = {"TTS_NGINX_RATE_LOGIN": "600r/m", "TTS_NGINX_BURST_LOGIN": "100"}
    instance = start_nginx(web, "nginx-logins", env=loose)
    try:
        yield instance
    finally:
        web.stop_service(instance.service)


@pytest.fixture
def user(transactional_db: None, django_user_model: Any, request: pytest.FixtureRequest) -> str:
    name = f"{request.node.name[:40]}@example.com"
    django_user_model.objects.create_user(name, email=name, password=PASSWORD)
    return name


_sessions: dict[tuple[str, str], requests.Session] = {}


def _form(edge: NginxInstance, source: str) -> tuple[requests.Session, str]:
    """A client at ``source`` (one connection per address, kept) holding the log-in form's CSRF token."""
    session = _sessions.setdefault((edge.base, source), client(source))
    page = session.get(edge.url("/accounts/login/"), timeout=30)
    assert page.status_code == 200
    token = CSRF_RE.search(page.text)
    assert token is not None
    return session, token.group(1)


def _login(edge: NginxInstance, source: str, username: str, password: str) -> requests.Response:
    return _post(edge, _form(edge, source), username, password)


def _post(
    edge: NginxInstance, form: tuple[requests.Session, str], username: str, password: str
) -> requests.Response:
    session, token = form
    return session.post(
        edge.url("/accounts/login/"),
        data={"csrfmiddlewaretoken": token, "username": username, "password": password},
        # A forged address must change nothing: Nginx sets the one Django counts.
        headers={
            "Referer": edge.url("/accounts/login/"),
            "X-Forwarded-For": "10.9.9.9",
            "X-Real-IP": "10.9.9.9",
        },
        allow_redirects=False,
        timeout=30,
    )


def test_six_wrong_passwords_from_one_address_do_not_lock_the_owner_out(
    edge: NginxInstance, user: str
) -> None:
    for _ in range(6):
        assert _login(edge, "127.0.0.3", user, "guess").status_code in (200, 429)
    owner = _login(edge, "127.0.0.4", user, PASSWORD)
    assert owner.status_code == 302, owner.status_code
    # That address stays locked for this user name (the owner's success elsewhere lifts nothing here).
    locked = _login(edge, "127.0.0.3", user, PASSWORD)
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) > 60


def test_guessing_from_many_addresses_is_slowed_down_but_a_fresh_address_gets_in(
    edge: NginxInstance, user: str
) -> None:
    # Four failures from two addresses: below TTS_LOGIN_SLOWDOWN_AFTER (5), an address may try again.
    for source in ("127.0.0.5", "127.0.0.5", "127.0.0.6", "127.0.0.6"):
        assert _login(edge, source, user, "guess").status_code == 200
    # From the fifth on, each failure doubles the delay (1 s, 2 s, 4 s, 8 s); fresh addresses are heard.
    for source in ("127.0.0.7", "127.0.0.8", "127.0.0.9"):
        assert _login(edge, source, user, "guess").status_code == 200
    failed_before = _form(edge, "127.0.0.5")  # ready, so that its try follows the last failure at once
    assert _login(edge, "127.0.0.10", user, "guess").status_code == 200  # a fresh address is heard
    slowed = _post(edge, failed_before, user, PASSWORD)
    assert slowed.status_code == 429 and 1 <= int(slowed.headers["Retry-After"]) <= 8
    # The right password from an address that has not failed is never refused.
    assert _login(edge, "127.0.0.11", user, PASSWORD).status_code == 302
