"""Sign-up, e-mail links, log in with a second factor, lockout: the dashboard's account pages."""

from __future__ import annotations

import re
import time
from typing import Any, cast

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client, override_settings

from tests.dashboard_data import PASSWORD
from tests.integration.dashboard.conftest import client_for, redirect_url
from tests.redis_database import clear_cache

SIGNUP = {"email": "new@example.com", "organization": "New Co", "password": PASSWORD}


@pytest.fixture(autouse=True)
def fresh_throttle(stack: Any) -> None:
    clear_cache()


def _link(pattern: str) -> str:
    match = re.search(pattern, cast(str, mail.outbox[-1].body))  # str bodies (stubs allow lazy)
    assert match, mail.outbox[-1].body
    return match.group(0)


def test_front_door_offers_sign_up_log_in_and_api_docs(db: None) -> None:
    page = Client().get("/")
    assert page.status_code == 200
    html = page.content.decode()
    for href in ("/accounts/signup/", "/accounts/login/", "/api/docs", "/v1/audio/speech"):
        assert href in html


def test_signed_in_people_land_on_synthesize(owner: tuple[Any, Any]) -> None:
    assert redirect_url(client_for(owner[0]).get("/")) == "/app/synthesize/"


@override_settings(TTS_SIGNUP="invite", TTS_SIGNUP_CONTACT="accounts@example.com")
def test_it_tells_a_newcomer_on_an_invite_only_site_whom_to_ask(db: None) -> None:
    for path, status in (("/", 200), ("/accounts/signup/", 403)):
        page = Client().get(path)
        assert page.status_code == status
        html = page.content.decode()
        assert "Accounts here are by invitation" in html
        assert 'href="mailto:accounts@example.com"' in html and "/api/docs" in html
        assert 'href="/accounts/signup/"' not in html


@override_settings(TTS_SIGNUP="invite", TTS_SIGNUP_CONTACT="")
def test_it_names_the_organisations_owners_when_no_contact_is_set(db: None) -> None:
    assert "Ask an owner or admin of your organisation" in Client().get("/").content.decode()


@override_settings(TTS_SIGNUP="invite")
def test_invite_only_site_refuses_sign_up(db: None) -> None:
    response = Client().post("/accounts/signup/", SIGNUP)
    assert response.status_code == 403
    assert not get_user_model().objects.filter(email="new@example.com").exists()


def test_sign_up_makes_an_owner_who_must_confirm_the_address_first(db: None) -> None:
    from webapp.tenants.models import Membership

    client = Client()
    assert redirect_url(client.post("/accounts/signup/", SIGNUP)) == "/app/account/"
    membership = Membership.objects.get(user__email="new@example.com")
    assert membership.role == "owner" and membership.organization.name == "New Co"
    assert redirect_url(client.get("/app/keys/")) == "/app/account/"
    assert redirect_url(client.post("/app/jobs/", "{}", content_type="application/json")) == "/app/account/"

    # The link starts with TTS_PUBLIC_ORIGIN (tests/integration/dashboard/test_mail_links.py): its path.
    client.get(_link(r"/accounts/verify/\S+/"))
    assert client.get("/app/keys/").status_code == 200


def test_a_tampered_verification_link_is_refused(db: None) -> None:
    client = Client()
    client.post("/accounts/signup/", SIGNUP)
    link = _link(r"/accounts/verify/\S+/")
    assert client.get(link[:-5] + "XXXX/").status_code == 400
    assert redirect_url(client.get("/app/keys/")) == "/app/account/"


@override_settings(TTS_SIGNUP_PER_IP_HOURLY=2)
def test_sign_ups_are_throttled_per_client_ip(db: None) -> None:
    for n in range(2):
        data = {**SIGNUP, "email": f"p{n}@example.com"}
        assert Client(HTTP_X_REAL_IP="192.0.2.1").post("/accounts/signup/", data).status_code == 302
    third = Client(HTTP_X_REAL_IP="192.0.2.1").post(
        "/accounts/signup/", {**SIGNUP, "email": "p3@example.com"}
    )
    assert third.status_code == 429
    assert not get_user_model().objects.filter(email="p3@example.com").exists()
    other = Client(HTTP_X_REAL_IP="192.0.2.2").post(
        "/accounts/signup/", {**SIGNUP, "email": "p4@example.com"}
    )
    assert other.status_code == 302


def test_sign_up_refuses_an_address_already_in_use(owner: tuple[Any, Any]) -> None:
    response = Client().post("/accounts/signup/", {**SIGNUP, "email": "OWNER@example.com"})
    assert response.status_code == 200
    assert "exists" in response.content.decode()


def test_email_change_happens_only_through_the_link(owner: tuple[Any, Any]) -> None:
    user = owner[0]
    client = client_for(user)
    client.post("/app/account/", {"email": "renamed@example.com", "password": PASSWORD})
    user.refresh_from_db()
    assert user.email == "owner@example.com"
    assert mail.outbox[-1].to == ["renamed@example.com"]
    link = _link(r"/accounts/email/\S+/")
    client.get(link)
    user.refresh_from_db()
    assert user.email == "renamed@example.com"
    assert client.get(link).status_code == 400  # used once


def test_password_reset_mails_a_working_link(owner: tuple[Any, Any]) -> None:
    client = Client()
    assert client.post("/accounts/password/reset/", {"email": "owner@example.com"}).status_code == 302
    page = client.get(_link(r"/accounts/password/set/\S+/"), follow=True)
    form_url = page.redirect_chain[-1][0]
    new = "another-long-passphrase-7"
    done = client.post(form_url, {"new_password1": new, "new_password2": new})
    assert redirect_url(done) == "/accounts/password/done/"
    assert Client().login(username="owner@example.com", password=new)


def _enrol(client: Client, user: Any, codes: list[str] | None = None) -> str:
    """Enrol a TOTP app; returns its secret (and the recovery codes shown, into ``codes``)."""
    import base64

    from django_otp.oath import totp
    from django_otp.plugins.otp_totp.models import TOTPDevice

    client.get("/app/account/security/")
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    page = client.post(
        "/app/account/security/", {"code": f"{totp(device.bin_key):06d}", "password": PASSWORD}
    )
    assert len(page.context["recovery_codes"]) == 10
    if codes is not None:
        codes += page.context["recovery_codes"]
    return base64.b32encode(device.bin_key).decode()


def test_log_in_with_totp_needs_the_code_after_the_password(owner: tuple[Any, Any]) -> None:
    import base64

    from django_otp.oath import totp

    secret = _enrol(client_for(owner[0]), owner[0])
    client = Client()
    step = client.post("/accounts/login/", {"username": "owner@example.com", "password": PASSWORD})
    assert redirect_url(step).startswith("/accounts/login/code/")
    assert client.get("/app/usage/").status_code == 302  # not signed in yet
    wrong = client.post("/accounts/login/code/", {"code": "000000"})
    assert "not right" in wrong.content.decode()
    time.sleep(1.1)  # django-otp throttles: after one wrong code the next try waits a second
    code = f"{totp(base64.b32decode(secret), drift=1):06d}"
    assert redirect_url(client.post("/accounts/login/code/", {"code": code})) == "/app/synthesize/"
    assert client.get("/app/usage/").status_code == 200


def test_a_recovery_code_works_once(owner: tuple[Any, Any]) -> None:
    codes: list[str] = []
    _enrol(client_for(owner[0]), owner[0], codes)
    recovery = codes[3]
    for expected in ("/app/synthesize/", None):
        client = Client()
        client.post("/accounts/login/", {"username": "owner@example.com", "password": PASSWORD})
        answer = client.post("/accounts/login/code/", {"code": recovery})
        assert (redirect_url(answer) if answer.status_code == 302 else None) == expected


def test_repeated_failed_logins_lock_out(owner: tuple[Any, Any]) -> None:
    client = Client(HTTP_X_REAL_IP="198.51.100.7")
    for _ in range(5):
        client.post("/accounts/login/", {"username": "owner@example.com", "password": "wrong"})
    locked = client.post("/accounts/login/", {"username": "owner@example.com", "password": PASSWORD})
    assert locked.status_code == 429


def test_owner_on_a_plan_requiring_totp_must_enrol_first(owner: tuple[Any, Any]) -> None:
    user, org = owner
    org.plan.owners_need_totp = True
    org.plan.save()
    client = client_for(user)
    assert redirect_url(client.get("/app/history/")) == "/app/account/security/"
    _enrol(client, user)
    assert client.get("/app/history/").status_code == 200
