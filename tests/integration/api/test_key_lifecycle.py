"""A key's life (issue 35): last use with its address, a monthly character cap (429 key_quota_exceeded,
a child's cap within its parent's), rotation with an overlap, expiry warnings; the API and the keys page."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.utils import timezone

from tests.dashboard_data import member_of
from tests.integration.api.conftest import ApiClient, problem

MANAGE = ["speech:read", "speech:write", "keys:manage"]


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    """The keys page names hashed static files, as in production."""
    from pathlib import Path

    from django.conf import settings
    from django.core.management import call_command

    if not (Path(settings.STATIC_ROOT) / "staticfiles.json").exists():
        call_command("collectstatic", "--noinput", verbosity=0)


@pytest.fixture(autouse=True)
def no_dispatch(queued_only: None, builtin_voices: list[str]) -> None:
    """Accepted jobs stay queued (conftest's queued_only): the cap counts their reservations."""


def test_it_records_the_last_use_and_its_address_at_most_once_a_minute(make_tenant: Any) -> None:
    from webapp.tenants.models import ApiKey

    t = make_tenant(scopes=MANAGE)
    assert t.client.get("/api/v1/voices", HTTP_X_REAL_IP="192.0.2.7").status_code == 200
    key = ApiKey.objects.get(pk=t.key.pk)
    assert key.last_used_at is not None and key.last_used_ip == "192.0.2.7"
    t.client.get("/api/v1/voices", HTTP_X_REAL_IP="198.51.100.9")
    assert ApiKey.objects.get(pk=t.key.pk).last_used_ip == "192.0.2.7"  # within the minute: not written
    ApiKey.objects.filter(pk=t.key.pk).update(last_used_at=timezone.now() - dt.timedelta(minutes=2))
    t.client.get("/api/v1/voices", HTTP_X_REAL_IP="198.51.100.9")
    assert ApiKey.objects.get(pk=t.key.pk).last_used_ip == "198.51.100.9"
    listed = t.client.get("/api/v1/keys").json()["results"][0]
    assert listed["last_used_ip"] == "198.51.100.9" and listed["monthly_characters"] is None


def test_it_refuses_a_key_past_its_monthly_characters_and_not_the_others(make_tenant: Any) -> None:
    t = make_tenant(scopes=MANAGE)
    capped = t.client.post("/api/v1/keys", {"name": "capped", "monthly_characters": 25}).json()
    assert capped["monthly_characters"] == 25
    client = ApiClient(capped["secret"])
    assert client.post("/api/v1/speech", {"text": "abcdefghij"}).status_code == 202
    assert client.post("/api/v1/speech", {"text": "abcdefghij"}).status_code == 202
    refused = client.post("/api/v1/speech", {"text": "abcdefghij"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    body = problem(refused)
    assert body["code"] == "key_quota_exceeded" and "30 of this key's 25 characters" in body["detail"]
    assert client.post("/api/v1/speech", {"text": "abcde"}).status_code == 202  # exactly 25
    assert t.client.post("/api/v1/speech", {"text": "abcdefghij"}).status_code == 202  # another key
    openai = client.post("/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "x"})
    assert openai.status_code == 429 and openai.json()["error"]["code"] == "key_quota_exceeded"


def test_a_canceled_job_gives_its_characters_back_to_the_key_s_month(make_tenant: Any) -> None:
    t = make_tenant(scopes=MANAGE)
    capped = t.client.post("/api/v1/keys", {"name": "capped", "monthly_characters": 20}).json()
    client = ApiClient(capped["secret"])
    first = client.post("/api/v1/speech", {"text": "abcdefghij"}).json()
    assert client.post("/api/v1/speech", {"text": "abcdefghij"}).status_code == 202
    assert problem(client.post("/api/v1/speech", {"text": "a"}))["code"] == "key_quota_exceeded"
    assert client.delete(f"/api/v1/speech/{first['id']}").status_code == 204  # queued: released
    assert client.post("/api/v1/speech", {"text": "abcdefghij"}).status_code == 202


def test_a_key_made_by_a_capped_key_gets_no_higher_cap(make_tenant: Any) -> None:
    t = make_tenant(scopes=MANAGE)
    parent = t.client.post(
        "/api/v1/keys", {"name": "parent", "scopes": MANAGE, "monthly_characters": 100}
    ).json()
    as_parent = ApiClient(parent["secret"])
    assert as_parent.post("/api/v1/keys", {"name": "a"}).json()["monthly_characters"] == 100
    assert (
        as_parent.post("/api/v1/keys", {"name": "b", "monthly_characters": 40}).json()["monthly_characters"]
        == 40
    )
    over = as_parent.post("/api/v1/keys", {"name": "c", "monthly_characters": 101})
    assert over.status_code == 400 and problem(over)["field"] == "monthly_characters"


def test_it_rotates_a_key_with_an_overlap_then_refuses_the_old_secret(make_tenant: Any) -> None:
    from webapp.tenants.models import ApiKey

    t = make_tenant(scopes=MANAGE)
    made = t.client.post("/api/v1/keys", {"name": "svc", "scopes": MANAGE}).json()
    child = ApiClient(made["secret"]).post("/api/v1/keys", {"name": "child"}).json()
    rotated = t.client.post(f"/api/v1/keys/{made['id']}/rotate", {"overlap_seconds": 3600})
    assert rotated.status_code == 200 and rotated["Cache-Control"] == "no-store"
    new = rotated.json()
    assert new["id"] == made["id"] and new["prefix"] == made["prefix"] and new["secret"] != made["secret"]
    assert new["previous_valid_until"] is not None and new["rotated_at"] is not None
    old_client, new_client = ApiClient(made["secret"]), ApiClient(new["secret"])
    assert old_client.get("/api/v1/voices").status_code == 200  # in the overlap
    assert new_client.get("/api/v1/voices").status_code == 200
    assert ApiClient(child["secret"]).get("/api/v1/voices").status_code == 200  # its keys stay
    ApiKey.objects.filter(pk=made["id"]).update(previous_valid_until=timezone.now() - dt.timedelta(seconds=1))
    assert old_client.get("/api/v1/voices").status_code == 401
    assert new_client.get("/api/v1/voices").status_code == 200
    again = new_client.post(f"/api/v1/keys/{made['id']}/rotate", {}).json()  # a key rotates itself
    assert new_client.get("/api/v1/voices").status_code == 401  # overlap 0: stops at once
    assert ApiClient(again["secret"]).get("/api/v1/voices").status_code == 200
    too_long = t.client.post(f"/api/v1/keys/{made['id']}/rotate", {"overlap_seconds": 31 * 86400})
    assert too_long.status_code == 400


def test_it_flags_keys_that_expire_soon(make_tenant: Any) -> None:
    t = make_tenant(scopes=MANAGE)
    soon = (timezone.now() + dt.timedelta(days=3)).isoformat()
    later = (timezone.now() + dt.timedelta(days=90)).isoformat()
    t.client.post("/api/v1/keys", {"name": "soon", "expires_at": soon})
    t.client.post("/api/v1/keys", {"name": "later", "expires_at": later})
    flags = {k["name"]: k["expires_soon"] for k in t.client.get("/api/v1/keys").json()["results"]}
    assert flags == {"soon": True, "later": False, "test key": False}


def test_the_keys_page_shows_cap_use_and_expiry_and_rotates(make_tenant: Any) -> None:
    from django.test import Client

    from webapp.tenants.models import ApiKey
    from webapp.tenants.services import create_api_key

    t = make_tenant(scopes=MANAGE)
    owner = member_of(t.org, "owner@example.com", "owner")
    key, raw = create_api_key(
        t.org,
        "capped",
        created_by=owner,
        monthly_characters=1_000_000,
        expires_at=timezone.now() + dt.timedelta(days=5),
    )
    assert ApiClient(raw).post("/api/v1/speech", {"text": "x" * 1234}).status_code == 202
    page = Client()
    page.force_login(owner)
    html = page.get("/app/keys/").content.decode()
    assert "1,234 of 1,000,000" in html and 'id="expiry-warning"' in html and "capped" in html
    answer = page.post(f"/app/keys/{key.pk}/rotate/", {"overlap": "0"})
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    secret = re.search(r'<code id="new-key">(tts_[^<]+)</code>', answer.content.decode())
    assert secret and secret.group(1).startswith(f"tts_{key.prefix}_")
    assert ApiClient(raw).get("/api/v1/voices").status_code == 401
    assert ApiClient(secret.group(1)).get("/api/v1/voices").status_code == 200
    created = page.post("/app/keys/", {"name": "new", "scopes": ["speech:read"], "monthly_characters": "500"})
    assert created.status_code == 200 and ApiKey.objects.get(name="new").monthly_characters == 500


def test_only_a_keys_holder_or_an_owner_rotates_it_and_the_holder_is_told(
    make_tenant: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """An admin shown another admin's new secret would keep a working key after being removed."""
    from django.core import mail
    from django.test import Client

    from webapp.audit.models import AuditEvent
    from webapp.tenants.models import ApiKey
    from webapp.tenants.services import create_api_key

    t = make_tenant(scopes=MANAGE)
    owner = member_of(t.org, "owner@example.com", "owner")
    admin = member_of(t.org, "admin@example.com", "admin")
    holder = member_of(t.org, "holder@example.com", "admin")
    key, raw = create_api_key(t.org, "holder's", created_by=holder)
    as_admin, as_owner, as_holder = Client(), Client(), Client()
    as_admin.force_login(admin)
    as_owner.force_login(owner)
    as_holder.force_login(holder)
    rotate_form = f'action="/app/keys/{key.pk}/rotate/"'
    assert rotate_form not in as_admin.get("/app/keys/").content.decode()  # no button to press
    refused = as_admin.post(f"/app/keys/{key.pk}/rotate/", {"overlap": "0"}, follow=True)
    assert "Only the key&#x27;s holder or an owner" in refused.content.decode()
    assert 'id="new-key"' not in refused.content.decode()
    assert ApiClient(raw).get("/api/v1/voices").status_code == 200  # its secret is the same
    assert rotate_form in as_owner.get("/app/keys/").content.decode()
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        with_secret = as_owner.post(f"/app/keys/{key.pk}/rotate/", {"overlap": "3600"})
    assert with_secret.status_code == 200 and 'id="new-key"' in with_secret.content.decode()
    [told] = mail.outbox
    assert told.to == ["holder@example.com"] and "holder's" in told.subject and "owner" in told.body
    event = AuditEvent.objects.filter(action="key.rotated", target_id=str(key.pk)).latest("at")
    assert event.details["holder"] == holder.pk
    mail.outbox.clear()
    assert rotate_form in as_holder.get("/app/keys/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        mine = as_holder.post(f"/app/keys/{key.pk}/rotate/", {"overlap": "0"})  # its holder: nobody to tell
    assert 'id="new-key"' in mine.content.decode() and mail.outbox == []
    assert ApiKey.objects.get(pk=key.pk).previous_valid_until is None


def test_a_rotated_out_secret_authenticates_but_manages_no_key(make_tenant: Any) -> None:
    """A secret leaked during a rotation's overlap cannot rotate the key again and keep it."""
    t = make_tenant(scopes=MANAGE)
    made = t.client.post("/api/v1/keys", {"name": "svc", "scopes": MANAGE}).json()
    new = t.client.post(f"/api/v1/keys/{made['id']}/rotate", {"overlap_seconds": 3600}).json()
    old = ApiClient(made["secret"])
    assert old.get("/api/v1/voices").status_code == 200  # still in its overlap
    for answer in (
        old.post(f"/api/v1/keys/{made['id']}/rotate", {"overlap_seconds": 0}),
        old.post("/api/v1/keys", {"name": "kept"}),
        old.delete(f"/api/v1/keys/{made['id']}"),
    ):
        assert answer.status_code == 403, answer.content
        assert "rotated out" in problem(answer)["detail"]
    current = ApiClient(new["secret"])
    assert current.get("/api/v1/voices").status_code == 200
    assert current.post(f"/api/v1/keys/{made['id']}/rotate", {}).status_code == 200
