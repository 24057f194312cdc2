"""API keys: format, hashing, scopes, expiry, revocation, roles for key management."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from tests.integration.api.conftest import ApiClient, problem

pytestmark = pytest.mark.usefixtures("builtin_voices")


def test_key_is_shown_once_and_stored_as_hmac(make_tenant: Any) -> None:
    from webapp.tenants.services import hash_secret

    t = make_tenant()
    prefix, secret = t.raw_key.split("_")[1], t.raw_key.split("_", 2)[2]
    assert t.raw_key.startswith("tts_") and len(prefix) == 8 and t.key.prefix == prefix
    assert secret not in t.key.secret_hash and t.key.secret_hash == hash_secret(secret)
    assert t.client.get("/api/v1/voices").status_code == 200
    t.key.refresh_from_db()
    assert t.key.last_used_at is not None


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Bearer a b", "Basic dXNlcjpwYXNz", "tts_abcdefgh_" + "x" * 30, "Bearer \u00e9\u00e9"],
)
def test_malformed_authorization_header_is_401(make_tenant: Any, header: str) -> None:
    make_tenant()
    response = ApiClient(None).get("/api/v1/voices", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert problem(response)["code"] == "unauthenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("how", "source"),
    [
        ("authorization:Bearer", "bearer"),
        ("authorization:token", "token"),
        ("header", "xi-api-key header"),
        ("query:xi-api-key", "xi-api-key query"),
        ("query:xi_api_key", "xi-api-key query"),
    ],
)
def test_every_form_agents_send_a_key_in_is_accepted_over_http(
    make_tenant: Any, how: str, source: str
) -> None:
    t = make_tenant()
    kind, _, name = how.partition(":")
    client = ApiClient(None)
    if kind == "authorization":
        response = client.get("/api/v1/voices", HTTP_AUTHORIZATION=f"{name} {t.raw_key}")
    elif kind == "header":
        response = client.get("/api/v1/voices", HTTP_XI_API_KEY=t.raw_key)
    else:
        response = client.get(f"/api/v1/voices?{name}={t.raw_key}")
    assert response.status_code == 200, (source, response.content)
    # OpenAI's surface takes the same forms.
    assert client.get(f"/v1/models?xi-api-key={t.raw_key}").status_code == 200


def test_two_different_keys_in_one_request_are_refused(make_tenant: Any) -> None:
    a, b = make_tenant(), make_tenant()
    response = ApiClient(a.raw_key).get("/api/v1/voices", HTTP_XI_API_KEY=b.raw_key)
    assert response.status_code == 401
    assert "More than one API key" in problem(response)["detail"]
    # The same key twice is one credential.
    assert ApiClient(a.raw_key).get("/api/v1/voices", HTTP_XI_API_KEY=a.raw_key).status_code == 200


def test_wrong_keys_in_every_form_spend_one_budget_and_a_valid_key_still_passes(
    make_tenant: Any, settings: Any
) -> None:
    from webapp import redis_clients
    from webapp.tenants import auth_failures

    settings.TTS_AUTH_FAILURES_PER_IP = 4
    settings.TTS_AUTH_FAILURE_WINDOW_SECONDS = 60
    address = "192.0.2.77"
    redis_clients.heartbeats().delete(auth_failures.key(address))
    t = make_tenant()
    forged = "tts_AAAAAAAA_" + "A" * 40
    client = ApiClient(None)
    try:
        statuses = [
            client.get("/api/v1/voices", HTTP_X_REAL_IP=address, HTTP_AUTHORIZATION=f"Token {forged}"),
            client.get("/api/v1/voices", HTTP_X_REAL_IP=address, HTTP_XI_API_KEY=forged),
            client.get(f"/api/v1/voices?xi-api-key={forged}", HTTP_X_REAL_IP=address),
            client.get("/api/v1/voices?xi_api_key=", HTTP_X_REAL_IP=address),  # malformed counts too
            client.get("/api/v1/voices", HTTP_X_REAL_IP=address, HTTP_XI_API_KEY=forged),
        ]
        assert [r.status_code for r in statuses] == [401] * 4 + [429]
        assert problem(statuses[-1])["code"] == "too_many_auth_failures"
        ok = client.get(f"/api/v1/voices?xi-api-key={t.raw_key}", HTTP_X_REAL_IP=address)
        assert ok.status_code == 200
    finally:
        redis_clients.heartbeats().delete(auth_failures.key(address))


def test_missing_unknown_revoked_and_expired_keys_are_401(make_tenant: Any) -> None:
    from webapp.tenants.services import OPERATOR, create_api_key, revoke_api_key

    t = make_tenant()
    assert ApiClient(None).get("/api/v1/voices").status_code == 401
    wrong_secret = t.raw_key[:-4] + ("AAAA" if not t.raw_key.endswith("AAAA") else "BBBB")
    assert ApiClient(wrong_secret).get("/api/v1/voices").status_code == 401
    assert ApiClient("tts_ZZZZZZZZ_" + "y" * 43).get("/api/v1/voices").status_code == 401
    revoke_api_key(t.key, by=OPERATOR)
    assert t.client.get("/api/v1/voices").status_code == 401
    _, expired = create_api_key(
        t.org, "old", created_by=OPERATOR, expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert ApiClient(expired).get("/api/v1/voices").status_code == 401


def test_a_key_is_found_with_its_tenant_plan_and_role_in_one_query(
    make_tenant: Any, django_user_model: Any, django_assert_num_queries: Any
) -> None:
    from webapp.tenants.models import ApiKey, Membership
    from webapp.tenants.services import OPERATOR, create_api_key, find_api_key

    t = make_tenant()
    member = django_user_model.objects.create_user("keyholder", password="pw-keyholder-1")
    Membership.objects.create(user=member, organization=t.org, role="member")
    key, raw = create_api_key(t.org, "mine", created_by=OPERATOR, user=member, scopes=["speech:read"])
    with django_assert_num_queries(1):
        found = find_api_key(raw)
    assert found is not None
    orm = ApiKey.objects.select_related("organization__plan").get(pk=key.pk)
    with django_assert_num_queries(0):  # everything the request reads of the key came with it
        assert [getattr(found, f.attname) for f in ApiKey._meta.concrete_fields] == [
            getattr(orm, f.attname) for f in ApiKey._meta.concrete_fields
        ]
        assert found.scopes == ["speech:read"]  # the JSON column as Python values, not text
        assert found.organization == t.org and found.organization.plan == t.org.plan
        assert found.organization.plan.monthly_characters == orm.organization.plan.monthly_characters
        assert found.holder_role == "member"  # type: ignore[attr-defined]
    Membership.objects.filter(user=member).delete()
    assert find_api_key(raw) is None  # a key of a user who left the tenant is unusable


def test_key_without_scope_is_403(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = make_tenant(scopes=["speech:read"])
    response = t.client.post("/api/v1/speech", {"text": "Hello."})
    assert response.status_code == 403
    assert "speech:write" in problem(response)["detail"]
    assert not SynthesisJob.objects.filter(organization=t.org).exists()
    assert t.client.get("/api/v1/speech").status_code == 200
    assert t.client.delete("/api/v1/voices/en_US-joe-medium").status_code == 403


def test_key_management_roles(make_tenant: Any, django_user_model: Any) -> None:
    from webapp.errors import DomainError
    from webapp.problems import Problem
    from webapp.tenants.models import Membership
    from webapp.tenants.services import OPERATOR, create_api_key, revoke_api_key

    t = make_tenant()
    users = {}
    for role in ("owner", "admin", "member"):
        users[role] = django_user_model.objects.create_user(f"{role}-{t.org.slug}", password="x")
        Membership.objects.create(user=users[role], organization=t.org, role=role)
    outsider = django_user_model.objects.create_user(f"out-{t.org.slug}", password="x")
    key, _ = create_api_key(t.org, "by owner", created_by=users["owner"])
    create_api_key(t.org, "by admin", created_by=users["admin"])
    with pytest.raises(DomainError) as member:
        create_api_key(t.org, "by member", created_by=users["member"])
    assert Problem.of(member.value).status == 403
    with pytest.raises(DomainError) as out:
        revoke_api_key(key, by=outsider)
    assert Problem.of(out.value).status == 404
    with pytest.raises(DomainError):
        create_api_key(t.org, "bad scope", created_by=OPERATOR, scopes=["speech:everything"])
    revoke_api_key(key, by=users["admin"])
    key.refresh_from_db()
    assert key.revoked_at is not None
