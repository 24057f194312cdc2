"""Security changes of an account ask for the password again (issue 31, finding 7).

Turning two-step sign-in on or off and changing the e-mail need the password (and a current
code while two-step sign-in is on); each ends the account's other sessions and is audited; the
old address hears of an e-mail change; reset and confirmation mails are limited per address
and per client address.
"""

from __future__ import annotations

import re
import time
from typing import Any, cast

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client, override_settings

from tests.dashboard_data import PASSWORD, make_owner
from tests.integration.dashboard.conftest import client_for, redirect_url
from tests.redis_database import clear_cache
from webapp.audit.models import AuditEvent


@pytest.fixture(autouse=True)
def fresh_counters(stack: Any) -> None:
    clear_cache()


def _code(user: Any, step_ahead: int = 0) -> str:
    """The authenticator's code; ``step_ahead`` 1 is the next 30 s step's, which django-otp
    accepts (tolerance 1) after the current step's code was used (it refuses a code twice)."""
    from django_otp.oath import totp
    from django_otp.plugins.otp_totp.models import TOTPDevice

    device = TOTPDevice.objects.filter(user=user).order_by("-pk").first()
    return f"{totp(device.bin_key, drift=step_ahead):06d}"


def _enrol(client: Client, user: Any) -> None:
    client.get("/app/account/security/")
    page = client.post("/app/account/security/", {"code": _code(user), "password": PASSWORD})
    assert len(page.context["recovery_codes"]) == 10


def _has_totp(user: Any) -> bool:
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return TOTPDevice.objects.filter(user=user, confirmed=True).exists()


def _signed_in(client: Client) -> bool:
    return client.get("/app/account/").status_code == 200


def test_enrolling_a_staff_users_first_device_needs_the_password(db: None) -> None:
    staff = get_user_model().objects.create_user(
        username="ops@example.com", email="ops@example.com", password=PASSWORD, is_staff=True
    )
    client = client_for(staff)
    client.get("/app/account/security/")
    page = client.post("/app/account/security/", {"code": _code(staff)})
    assert not _has_totp(staff) and "password" in page.context["form"].errors
    client.post("/app/account/security/", {"code": _code(staff), "password": "wrong-password-1"})
    assert not _has_totp(staff)
    _enrol(client, staff)
    assert _has_totp(staff)
    assert AuditEvent.objects.filter(action="account.totp_enabled", actor=staff).exists()


def test_turning_two_step_sign_in_off_needs_the_password_and_a_current_code(
    owner: tuple[Any, Any],
) -> None:
    user = owner[0]
    client = client_for(user)
    _enrol(client, user)
    code = _code(user, step_ahead=1)
    for data in ({}, {"password": PASSWORD}, {"code": code}, {"password": "wrong-pass-1", "code": code}):
        assert client.post("/app/account/security/off/", data).status_code == 400
        assert _has_totp(user), data
    client.post("/app/account/security/off/", {"password": PASSWORD, "code": "000000"})
    assert _has_totp(user)
    time.sleep(1.1)  # django-otp throttles: after one wrong code the next try waits a second
    client.post("/app/account/security/off/", {"password": PASSWORD, "code": code})
    assert not _has_totp(user)
    assert AuditEvent.objects.filter(action="account.totp_disabled", actor=user).exists()


def test_changing_the_email_needs_the_password_and_tells_the_old_address(owner: tuple[Any, Any]) -> None:
    user = owner[0]
    client = client_for(user)
    for data in ({"email": "new@example.com"}, {"email": "new@example.com", "password": "wrong-pass-1"}):
        client.post("/app/account/", data)
    assert not mail.outbox
    client.post("/app/account/", {"email": "new@example.com", "password": PASSWORD})
    assert mail.outbox[-1].to == ["new@example.com"]
    link = re.search(r"/accounts/email/\S+/", cast(str, mail.outbox[-1].body))
    assert link
    client.get(link.group(0))
    user.refresh_from_db()
    assert user.email == "new@example.com"
    notice = mail.outbox[-1]
    assert notice.to == ["owner@example.com"] and "new@example.com" in cast(str, notice.body)
    actions = set(AuditEvent.objects.filter(actor=user).values_list("action", flat=True))
    assert {"account.email_change_requested", "account.email_changed"} <= actions


def test_changing_the_email_with_two_step_sign_in_needs_a_code_too(owner: tuple[Any, Any]) -> None:
    user = owner[0]
    client = client_for(user)
    _enrol(client, user)
    client.post("/app/account/", {"email": "new@example.com", "password": PASSWORD})
    assert not mail.outbox
    code = _code(user, step_ahead=1)
    client.post("/app/account/", {"email": "new@example.com", "password": PASSWORD, "code": code})
    assert mail.outbox[-1].to == ["new@example.com"]


def test_an_email_change_does_not_tell_whether_the_new_address_has_an_account(
    owner: tuple[Any, Any],
) -> None:
    make_owner("taken@example.com", organization="Other")
    client = client_for(owner[0])
    answers = []
    for email in ("taken@example.com", "free@example.com"):
        page = client.post("/app/account/", {"email": email, "password": PASSWORD}, follow=True)
        said = [str(m).replace(email, "ADDRESS") for m in page.context["messages"]]
        answers.append((page.redirect_chain, page.status_code, said))
        assert mail.outbox[-1].to == [email]
    assert answers[0] == answers[1]
    assert "/accounts/email/" not in cast(str, mail.outbox[0].body)  # the taken address gets a notice


def test_a_security_change_ends_the_other_sessions(owner: tuple[Any, Any]) -> None:
    user = owner[0]
    here, elsewhere = client_for(user), client_for(user)
    _enrol(here, user)
    assert _signed_in(here) and not _signed_in(elsewhere)
    elsewhere = client_for(user)
    here.post("/app/account/security/off/", {"password": PASSWORD, "code": _code(user, step_ahead=1)})
    assert _signed_in(here) and not _signed_in(elsewhere)


def test_a_password_reset_ends_every_session_and_is_audited(owner: tuple[Any, Any]) -> None:
    user = owner[0]
    elsewhere = client_for(user)
    client = Client()
    client.post("/accounts/password/reset/", {"email": "owner@example.com"})
    link = re.search(r"/accounts/password/set/\S+/", cast(str, mail.outbox[-1].body))
    assert link
    page = client.get(link.group(0), follow=True)
    new = "another-long-passphrase-7"
    client.post(page.redirect_chain[-1][0], {"new_password1": new, "new_password2": new})
    assert not _signed_in(elsewhere)
    assert AuditEvent.objects.filter(action="account.password_changed", actor=user).exists()


@override_settings(TTS_ACCOUNT_MAILS_PER_ADDRESS_HOURLY=2, TTS_ACCOUNT_MAILS_PER_IP_HOURLY=3)
def test_reset_mails_are_limited_per_address_and_per_client_address(owner: tuple[Any, Any]) -> None:
    make_owner("second@example.com", organization="Two")
    for n in range(2):
        client = Client(HTTP_X_REAL_IP=f"192.0.2.{n + 1}")
        assert client.post("/accounts/password/reset/", {"email": "owner@example.com"}).status_code == 302
    third = Client(HTTP_X_REAL_IP="192.0.2.9").post(
        "/accounts/password/reset/", {"email": "owner@example.com"}
    )
    assert third.status_code == 429 and len(mail.outbox) == 2
    # One client address: its third mail of the hour (across addresses) is refused, registered or not.
    same = Client(HTTP_X_REAL_IP="192.0.2.1")
    assert same.post("/accounts/password/reset/", {"email": "second@example.com"}).status_code == 302
    assert same.post("/accounts/password/reset/", {"email": "nobody@example.com"}).status_code == 302
    assert same.post("/accounts/password/reset/", {"email": "second@example.com"}).status_code == 429
    assert len(mail.outbox) == 3


@override_settings(TTS_ACCOUNT_MAILS_PER_ADDRESS_HOURLY=2)
def test_confirmation_mails_are_limited_per_address(db: None) -> None:
    client = Client()
    client.post(
        "/accounts/signup/", {"email": "fresh@example.com", "organization": "F", "password": PASSWORD}
    )
    for _ in range(2):  # the sign-up's own mail is within the sign-up's budget
        assert redirect_url(client.post("/app/account/verify/")) == "/app/account/"
    refused = client.post("/app/account/verify/")
    assert refused.status_code == 429 and len(mail.outbox) == 3
