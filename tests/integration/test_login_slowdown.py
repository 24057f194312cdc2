"""Failed log-ins lock a (user name, address) pair, never the account; guessing from many addresses slows down.

Issue 31, finding 5. Both log-in forms (the dashboard's and the admin's) go
through the same backend. The client address is the header Nginx sets
(X-Real-IP, always overwritten there: tests/e2e/test_nginx_forwarded.py), so
the Django test client sends it as Nginx would; tests/e2e/test_login_lockout.py
does the same through the real Nginx and gunicorn.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client, override_settings

PASSWORD = "correct horse battery staple"
USER = "victim@example.com"
LOGIN_PAGES = ["/accounts/login/", "/admin/login/"]


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    """The admin's login page names hashed static files, as in production."""
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)


@pytest.fixture
def victim(db: None, django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(USER, email=USER, password=PASSWORD, is_staff=True)


def _login(page: str, ip: str, password: str) -> Any:
    return Client(HTTP_X_REAL_IP=ip).post(page, {"username": USER, "password": password, "next": "/admin/"})


def _failed(response: Any) -> bool:
    """A password that was checked and found wrong: the form again, not a lockout."""
    return response.status_code == 200


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_failures_from_one_address_do_not_lock_the_account_elsewhere(victim: Any, page: str) -> None:
    for _ in range(6):
        _login(page, "127.0.0.3", "guess")
    assert _login(page, "127.0.0.3", PASSWORD).status_code == 429  # that pair is locked
    assert _login(page, "127.0.0.4", PASSWORD).status_code == 302  # the owner, elsewhere, is not


def test_a_locked_pair_says_when_to_retry(victim: Any) -> None:
    from django.conf import settings

    for _ in range(5):
        _login(LOGIN_PAGES[0], "127.0.0.3", "guess")
    locked = _login(LOGIN_PAGES[0], "127.0.0.3", PASSWORD)
    assert locked.status_code == 429
    cool_off = settings.AXES_COOLOFF_TIME * 3600
    assert cool_off - 60 < int(locked["Retry-After"]) <= cool_off


@override_settings(TTS_LOGIN_SLOWDOWN_AFTER=1)
def test_guessing_one_user_from_many_addresses_slows_down_but_never_refuses_a_fresh_address(
    victim: Any,
) -> None:
    from axes.models import AccessAttempt

    page = LOGIN_PAGES[0]
    for ip in ("127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4"):  # 4 failures: a delay of 8 s
        assert _failed(_login(page, ip, "guess"))

    def retry_after(ip: str) -> int:
        """What an address that failed for this user name is told, even with the right password."""
        slowed = _login(page, ip, PASSWORD)
        assert slowed.status_code == 429, slowed.status_code
        return int(slowed["Retry-After"])

    # Each bound leaves 2 s for a slow machine between the last failure and the attempt.
    assert 6 < retry_after("127.0.1.1") <= 8
    # A fresh address is always heard: a wrong password is checked, counts, and doubles the delay ...
    assert _failed(_login(page, "127.0.1.5", "guess"))
    assert 14 < retry_after("127.0.1.2") <= 16
    assert _failed(_login(page, "127.0.1.6", "guess"))
    assert 30 < retry_after("127.0.1.3") <= 32
    # ... and the right password from a fresh address gets in at once.
    assert _login(page, "127.0.1.7", PASSWORD).status_code == 302
    # The refused attempts were not counted: the 6 wrong passwords only.
    total = sum(AccessAttempt.objects.filter(username=USER).values_list("failures_since_start", flat=True))
    assert total == 6
    # Once the delay has passed (every failure moved 40 s back), a failed address is heard again.
    for attempt in AccessAttempt.objects.filter(username=USER):
        attempt.attempt_time -= dt.timedelta(seconds=40)
        attempt.save(update_fields=["attempt_time"])
    assert _login(page, "127.0.1.1", PASSWORD).status_code == 302


@override_settings(TTS_LOGIN_SLOWDOWN_AFTER=1, TTS_LOGIN_SLOWDOWN_MAX_SECONDS=8)
def test_the_delay_is_bounded(victim: Any) -> None:
    from webapp.login_guard import slowdown_delay

    assert [slowdown_delay(n) for n in (0, 1, 2, 3, 4, 5, 10_000)] == [0, 1, 2, 4, 8, 8, 8]
    for n in range(6):
        _login(LOGIN_PAGES[0], f"127.0.2.{n + 1}", "guess")
    assert int(_login(LOGIN_PAGES[0], "127.0.2.1", PASSWORD)["Retry-After"]) <= 8
