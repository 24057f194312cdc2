"""``/api/v1/keys``: owners and admins list, create and revoke keys; the secret is shown once."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
from django.utils import timezone

from tests.integration.api.conftest import ApiClient, problem
from tests.integration.api.people import key_for, member

pytestmark = pytest.mark.usefixtures("builtin_voices")

MANAGE = ["speech:read", "speech:write", "keys:manage"]
KEY_RE = re.compile(r"^tts_[A-Za-z0-9]{8}_[A-Za-z0-9_-]{20,128}$")


@pytest.fixture
def owner(make_tenant: Any) -> Any:
    """A tenant and a key of its owner that may manage keys."""
    tenant = make_tenant()
    tenant.owner = member(tenant, "owner")
    tenant.manager = key_for(tenant, tenant.owner, MANAGE)
    return tenant


def test_owner_creates_a_key_whose_secret_is_shown_once(owner: Any) -> None:
    from webapp.tenants.models import ApiKey
    from webapp.tenants.services import hash_secret

    response = owner.manager.post("/api/v1/keys", {"name": "ci"})
    assert response.status_code == 201
    body = response.json()
    assert KEY_RE.match(body["secret"]) and response["Cache-Control"] == "no-store"
    assert body["scopes"] == ["speech:read", "speech:write"]  # the default: never key management
    assert body["user"] == owner.owner.username and body["name"] == "ci"
    assert response["Location"] == f"/api/v1/keys/{body['id']}"
    stored = ApiKey.objects.get(pk=body["id"])
    assert stored.secret_hash == hash_secret(body["secret"].split("_", 2)[2])
    new = ApiClient(body["secret"])
    assert new.get("/api/v1/speech").status_code == 200
    assert new.get("/api/v1/keys").status_code == 403
    listed = owner.manager.get("/api/v1/keys").json()["results"]
    entry = next(k for k in listed if k["id"] == body["id"])
    assert "secret" not in entry and "secret_hash" not in entry
    assert body["secret"] not in owner.manager.get("/api/v1/keys").content.decode()


def test_list_shows_name_scopes_expiry_rate_and_last_use(owner: Any) -> None:
    expires = (timezone.now() + dt.timedelta(days=30)).replace(microsecond=0)
    created = owner.manager.post(
        "/api/v1/keys",
        {
            "name": "nightly",
            "scopes": ["speech:read"],
            "expires_at": expires.isoformat(),
            "requests_per_minute": 7,
        },
    ).json()
    ApiClient(created["secret"]).get("/api/v1/voices")
    listed = owner.manager.get("/api/v1/keys").json()["results"]
    entry = next(k for k in listed if k["id"] == created["id"])
    assert entry["scopes"] == ["speech:read"] and entry["requests_per_minute"] == 7
    assert dt.datetime.fromisoformat(entry["expires_at"]) == expires
    assert entry["last_used_at"] is not None and entry["revoked_at"] is None
    assert listed[0]["id"] == created["id"]  # newest first
    assert {"id", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at"} <= set(entry)


def test_key_management_is_granted_only_when_asked(owner: Any) -> None:
    body = owner.manager.post("/api/v1/keys", {"name": "deputy", "scopes": MANAGE}).json()
    assert body["scopes"] == MANAGE
    deputy = ApiClient(body["secret"])
    assert deputy.get("/api/v1/keys").status_code == 200


def test_revoking_a_key_stops_it_at_once(owner: Any) -> None:
    created = owner.manager.post("/api/v1/keys", {"name": "short-lived"}).json()
    victim = ApiClient(created["secret"])
    assert victim.get("/api/v1/voices").status_code == 200
    assert owner.manager.delete(f"/api/v1/keys/{created['id']}").status_code == 204
    assert victim.get("/api/v1/voices").status_code == 401
    listed = owner.manager.get("/api/v1/keys").json()["results"]
    assert next(k for k in listed if k["id"] == created["id"])["revoked_at"] is not None
    assert owner.manager.delete(f"/api/v1/keys/{created['id']}").status_code == 204  # idempotent


def test_another_tenants_key_is_404_and_stays_usable(owner: Any, make_tenant: Any) -> None:
    other = make_tenant()
    response = owner.manager.delete(f"/api/v1/keys/{other.key.pk}")
    assert response.status_code == 404 and problem(response)["code"] == "not_found"
    assert other.client.get("/api/v1/voices").status_code == 200
    assert str(other.key.pk) not in owner.manager.get("/api/v1/keys").content.decode()
    bad = owner.manager.delete("/api/v1/keys/not-a-uuid")
    assert bad.status_code == 400 and problem(bad)["code"] == "invalid_id"
    assert owner.manager.delete(f"/api/v1/keys/{uuid.uuid4()}").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": 12}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "k", "color": "red"}, "color"),
        ({"name": "k", "scopes": []}, "scopes"),
        ({"name": "k", "scopes": "speech:read"}, "scopes"),
        ({"name": "k", "scopes": [1]}, "scopes"),
        ({"name": "k", "expires_at": "yesterday"}, "expires_at"),
        ({"name": "k", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "k", "requests_per_minute": 0}, "requests_per_minute"),
        ({"name": "k", "requests_per_minute": "5"}, "requests_per_minute"),
        ({"name": "k", "requests_per_minute": True}, "requests_per_minute"),
        (["name"], None),
    ],
)
def test_bad_key_requests_are_400_and_create_nothing(owner: Any, body: Any, field: str | None) -> None:
    from webapp.tenants.models import ApiKey

    before = ApiKey.objects.count()
    response = owner.manager.post("/api/v1/keys", body)
    assert response.status_code == 400, response.content
    found = problem(response)
    if field is not None:
        assert found["field"].startswith(field)
    assert ApiKey.objects.count() == before


def test_unknown_scope_is_invalid_scope(owner: Any) -> None:
    response = owner.manager.post("/api/v1/keys", {"name": "k", "scopes": ["speech:everything"]})
    assert response.status_code == 400
    body = problem(response)
    assert body["code"] == "invalid_scope" and "speech:everything" in body["detail"]


def test_admin_may_not_hand_a_member_more_than_the_member_may_use(owner: Any) -> None:
    """A member's key cannot carry key management, even issued by the operator."""
    from webapp.errors import DomainError
    from webapp.tenants.services import OPERATOR, create_api_key

    someone = member(owner, "member")
    with pytest.raises(DomainError) as refused:
        create_api_key(owner.org, "too much", created_by=OPERATOR, user=someone, scopes=MANAGE)
    assert refused.value.code == "invalid_scope" and "keys:manage" in refused.value.message


def test_the_role_check_in_key_management_is_never_skipped(owner: Any) -> None:
    """No acting user is no longer a pass: the actor is required and must be an owner or admin."""
    from webapp.errors import DomainError
    from webapp.tenants.services import create_api_key, revoke_api_key

    with pytest.raises(TypeError):
        create_api_key(owner.org, "nobody")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        revoke_api_key(owner.key)  # type: ignore[call-arg]
    for actor in (None, owner.key):  # nobody; a key without keys:manage
        with pytest.raises(DomainError) as refused:
            create_api_key(owner.org, "nobody", created_by=actor)
        assert refused.value.code == "permission_denied"
        with pytest.raises(DomainError):
            revoke_api_key(owner.key, by=actor)
    owner.key.refresh_from_db()
    assert owner.key.revoked_at is None


def test_a_key_whose_user_left_the_tenant_stops_working(owner: Any) -> None:
    from webapp.tenants.models import Membership

    leaver = member(owner, "admin")
    client = key_for(owner, leaver, ["speech:read"])
    assert client.get("/api/v1/voices").status_code == 200
    Membership.objects.filter(user=leaver).delete()
    assert client.get("/api/v1/voices").status_code == 401
    leaver_id = leaver.pk
    leaver.delete()  # and a deleted user's keys go with the user
    assert not owner.org.api_keys.filter(user_id=leaver_id).exists()
