"""Operator login: lockout after repeated failures (django-axes) and a TOTP second factor (django-otp).

Every test goes through the admin's real login form: a POST to /admin/login/
with the CSRF token the form handed out, then a look at what the session may do.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client, override_settings

PASSWORD = "correct horse battery staple"
CSRF_RE = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    """The admin's pages name hashed static files, as in production."""
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)


@pytest.fixture
def operator(db: None, django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(
        "operator", password=PASSWORD, is_staff=True, is_superuser=True
    )


def _client(ip: str = "192.0.2.10") -> Client:
    # X-Real-IP is what Nginx sets from the peer address; axes counts per client address.
    return Client(enforce_csrf_checks=True, HTTP_X_REAL_IP=ip)


def _login(client: Client, username: str, password: str, **extra: str) -> Any:
    form = client.get("/admin/login/")
    assert form.status_code == 200
    token = CSRF_RE.search(form.content.decode())
    assert token is not None
    data = {"username": username, "password": password, "next": "/admin/", **extra}
    return client.post("/admin/login/", {"csrfmiddlewaretoken": token.group(1), **data})


def _in_admin(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_password_alone_logs_staff_in_when_the_second_factor_is_off(operator: Any) -> None:
    client = _client()
    response = _login(client, "operator", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert _in_admin(client)


@override_settings(AXES_FAILURE_LIMIT=3)
def test_repeated_failures_lock_the_client_out_even_with_the_right_password(operator: Any) -> None:
    from axes.models import AccessAttempt

    client = _client()
    for _ in range(2):
        wrong = _login(client, "operator", "guess")
        assert wrong.status_code == 200 and not _in_admin(client)
    locked = _login(client, "operator", "guess")
    assert locked.status_code == 429
    # Locked: the right password does not get in either from this address; the lock is on the
    # (user name, address) pair, so from another address the operator still gets in (issue 31).
    assert _login(client, "operator", PASSWORD).status_code == 429 and not _in_admin(client)
    elsewhere = _client("198.51.100.7")
    assert _login(elsewhere, "operator", PASSWORD).status_code == 302 and _in_admin(elsewhere)
    assert AccessAttempt.objects.filter(ip_address="192.0.2.10").exists()


@override_settings(AXES_FAILURE_LIMIT=3)
def test_an_operator_lifts_the_lockout(operator: Any) -> None:
    from django.core.management import call_command

    client = _client()
    for _ in range(3):
        _login(client, "operator", "guess")
    assert _login(client, "operator", PASSWORD).status_code == 429
    call_command("axes_reset", verbosity=0)
    assert _login(client, "operator", PASSWORD).status_code == 302 and _in_admin(client)


@override_settings(AXES_FAILURE_LIMIT=3)
def test_a_success_resets_the_failure_count(operator: Any) -> None:
    client = _client()
    for _ in range(2):
        _login(client, "operator", "guess")
    assert _login(client, "operator", PASSWORD).status_code == 302
    client.logout()
    for _ in range(2):
        assert _login(client, "operator", "guess").status_code == 200
    assert _login(client, "operator", PASSWORD).status_code == 302


def _totp_device(user: Any) -> Any:
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return TOTPDevice.objects.create(user=user, name="admin", confirmed=True)


def _current_code(device: Any) -> str:
    from django_otp.oath import TOTP

    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return str(totp.token()).zfill(device.digits)


@override_settings(TTS_ADMIN_REQUIRE_OTP=True)
def test_staff_need_the_totp_code_when_the_second_factor_is_on(operator: Any) -> None:
    device = _totp_device(operator)
    device_id = device.persistent_id
    client = _client()
    no_code = _login(client, "operator", PASSWORD)
    assert no_code.status_code == 200 and not _in_admin(client)
    wrong_code = _login(client, "operator", PASSWORD, otp_device=device_id, otp_token="000000")
    assert wrong_code.status_code == 200 and not _in_admin(client)
    device.refresh_from_db()
    device.throttling_failure_count = 0  # the wrong code started django-otp's own back-off
    device.throttling_failure_timestamp = None
    device.save()
    right = _login(client, "operator", PASSWORD, otp_device=device_id, otp_token=_current_code(device))
    assert right.status_code == 302 and _in_admin(client)


@override_settings(TTS_ADMIN_REQUIRE_OTP=True)
def test_it_signs_an_operator_in_with_password_and_code_in_one_submission(operator: Any) -> None:
    device = _totp_device(operator)
    client = _client()
    page = client.get("/admin/login/").content.decode()
    assert 'name="otp_token"' in page and 'name="otp_device"' not in page
    right = _login(client, "operator", PASSWORD, otp_token=_current_code(device))
    assert right.status_code == 302 and right["Location"] == "/admin/" and _in_admin(client)


@override_settings(TTS_ADMIN_REQUIRE_OTP=True, AXES_FAILURE_LIMIT=3)
def test_it_counts_wrong_codes_after_the_right_password_toward_the_lockout(operator: Any) -> None:
    device = _totp_device(operator)
    client = _client()
    for _ in range(2):
        wrong = _login(client, "operator", PASSWORD, otp_token="000000")
        assert wrong.status_code == 200 and not _in_admin(client)
        device.refresh_from_db()
        device.throttling_failure_count = 0  # django-otp's own back-off is not what is tested here
        device.throttling_failure_timestamp = None
        device.save()
    assert _login(client, "operator", PASSWORD, otp_token="000000").status_code == 429
    locked = _login(client, "operator", PASSWORD, otp_token=_current_code(device))
    assert locked.status_code == 429 and not _in_admin(client)


@override_settings(TTS_ADMIN_REQUIRE_OTP=True)
def test_it_says_so_when_an_operator_has_no_authenticator(operator: Any) -> None:
    response = _login(_client(), "operator", PASSWORD, otp_token="123456")
    assert response.status_code == 200 and "enroll_totp" in response.content.decode()


@override_settings(TTS_ADMIN_REQUIRE_OTP=True)
def test_a_session_without_the_second_factor_is_not_let_in(operator: Any) -> None:
    client = _client()
    client.force_login(operator)  # a password-only session, e.g. from before the setting was turned on
    response = client.get("/admin/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    _totp_device(operator)
    assert _login(client, "operator", PASSWORD).status_code == 200 and not _in_admin(client)


@override_settings(TTS_ADMIN_REQUIRE_OTP=True)
def test_enroll_totp_gives_a_staff_user_a_working_device(operator: Any, django_user_model: Any) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command
    from django_otp.plugins.otp_totp.models import TOTPDevice

    out = StringIO()
    call_command("enroll_totp", "operator", "--no-qr", stdout=out)
    assert "otpauth://totp/" in out.getvalue()
    device = TOTPDevice.objects.get(user=operator)
    client = _client()
    code = _current_code(device)
    assert (
        _login(client, "operator", PASSWORD, otp_device=device.persistent_id, otp_token=code).status_code
        == 302
    )
    with pytest.raises(CommandError):
        call_command("enroll_totp", "operator", stdout=StringIO())  # has one already
    django_user_model.objects.create_user("customer", password=PASSWORD)
    with pytest.raises(CommandError):
        call_command("enroll_totp", "customer", stdout=StringIO())  # not staff


@override_settings(TTS_ADMIN_REQUIRE_OTP=True)
def test_bootstrap_enrols_the_first_admin_when_the_second_factor_is_on(db: None) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from webapp.tenants.models import ApiKey

    out = StringIO()
    call_command("bootstrap_demo", stdout=out)
    assert "otpauth://totp/" in out.getvalue()
    device = TOTPDevice.objects.get(user__username="admin")
    assert device.confirmed
    demo_key = ApiKey.objects.get(organization__slug="demo")
    assert demo_key.user == device.user and sorted(demo_key.scopes) == sorted(ApiKey.ALL_SCOPES)
