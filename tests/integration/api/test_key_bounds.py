"""A key never does more than what it acts for: the key that made it, and a user who is still there.

Issue 31, findings 3 and 8: a key that manages keys mints keys no longer-lived,
faster or wider than itself, and revoking it revokes what it minted; a key of a
deactivated user or of a removed member answers 401.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from tests.integration.api.conftest import ApiClient, problem
from tests.integration.api.people import member

MANAGE = ["speech:read", "speech:write", "keys:manage"]


@pytest.fixture
def manager(make_tenant: Any) -> Any:
    """A tenant whose admin holds a key-managing key that expires in a day, limited to 30 requests a minute."""
    from webapp.tenants.services import OPERATOR, create_api_key

    tenant = make_tenant()
    tenant.admin = member(tenant, "admin")
    tenant.expires = (timezone.now() + dt.timedelta(days=1)).replace(microsecond=0)
    tenant.parent, raw = create_api_key(
        tenant.org,
        "manager",
        created_by=OPERATOR,
        user=tenant.admin,
        scopes=MANAGE,
        expires_at=tenant.expires,
        requests_per_minute=30,
    )
    tenant.manager = ApiClient(raw)
    return tenant


def _create(tenant: Any, client: ApiClient | None = None, **body: Any) -> Any:
    return (client or tenant.manager).post("/api/v1/keys", {"name": "child", **body})


def test_a_new_key_without_expiry_or_rate_takes_its_creators(manager: Any) -> None:
    response = _create(manager)
    assert response.status_code == 201, response.content
    body = response.json()
    assert dt.datetime.fromisoformat(body["expires_at"]) == manager.expires
    assert body["requests_per_minute"] == 30
    assert body["parent_id"] == str(manager.parent.pk)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"expires_at": "later"}, "expires_at"),
        ({"requests_per_minute": 31}, "requests_per_minute"),
        ({"scopes": ["speech:read", "voices:write"]}, "scopes"),
    ],
)
def test_a_key_may_not_outlive_outrank_or_outscope_its_creator(
    manager: Any, extra: dict[str, Any], field: str
) -> None:
    from webapp.tenants.models import ApiKey

    if extra.get("expires_at") == "later":
        extra = {"expires_at": (manager.expires + dt.timedelta(seconds=1)).isoformat()}
    before = ApiKey.objects.count()
    response = _create(manager, **extra)
    assert response.status_code == 400, response.content
    found = problem(response)
    assert found["field"] == field and "creat" in found["detail"]
    assert ApiKey.objects.count() == before


def test_the_default_scopes_are_cut_to_the_creators(manager: Any) -> None:
    reader = ApiClient(_create(manager, scopes=["speech:read", "keys:manage"]).json()["secret"])
    body = _create(manager, reader).json()
    assert body["scopes"] == ["speech:read"]
    only_manage = ApiClient(_create(manager, scopes=["keys:manage"]).json()["secret"])
    refused = _create(manager, only_manage)
    assert refused.status_code == 400 and problem(refused)["field"] == "scopes"


def test_a_key_within_its_creators_bounds_is_made(manager: Any) -> None:
    sooner = manager.expires - dt.timedelta(hours=1)
    response = _create(manager, expires_at=sooner.isoformat(), requests_per_minute=5, scopes=["speech:read"])
    assert response.status_code == 201, response.content
    body = response.json()
    assert dt.datetime.fromisoformat(body["expires_at"]) == sooner
    assert body["requests_per_minute"] == 5 and body["scopes"] == ["speech:read"]


def test_revoking_a_key_revokes_the_keys_it_made_and_theirs(manager: Any) -> None:
    child_body = _create(manager, scopes=MANAGE).json()
    child = ApiClient(child_body["secret"])
    grandchild = ApiClient(_create(manager, child).json()["secret"])
    sibling_tenant_key = manager.client  # made by the operator, not by the revoked key
    for client in (child, grandchild, sibling_tenant_key):
        assert client.get("/api/v1/voices").status_code == 200
    assert sibling_tenant_key.delete(f"/api/v1/keys/{manager.parent.pk}").status_code == 403  # no keys:manage
    from webapp.audit.models import AuditEvent
    from webapp.tenants.services import OPERATOR, revoke_api_key

    revoke_api_key(manager.parent, by=OPERATOR)
    assert manager.manager.get("/api/v1/voices").status_code == 401
    assert child.get("/api/v1/voices").status_code == 401
    assert grandchild.get("/api/v1/voices").status_code == 401
    assert sibling_tenant_key.get("/api/v1/voices").status_code == 200
    cascaded = AuditEvent.objects.filter(action="key.revoked", details__with_parent=str(manager.parent.pk))
    assert cascaded.count() == 2  # the child and the grandchild, each on the record


def test_revoking_through_the_api_cascades_too(manager: Any) -> None:
    child_body = _create(manager, scopes=MANAGE).json()
    child = ApiClient(child_body["secret"])
    grandchild = ApiClient(_create(manager, child).json()["secret"])
    assert manager.manager.delete(f"/api/v1/keys/{child_body['id']}").status_code == 204
    assert child.get("/api/v1/voices").status_code == 401
    assert grandchild.get("/api/v1/voices").status_code == 401
    assert manager.manager.get("/api/v1/voices").status_code == 200  # the parent stays


def test_a_key_made_by_a_person_is_bounded_by_their_role_only(manager: Any) -> None:
    """The dashboard's path: a person's key has no parent, and keeps today's rules (the role)."""
    from webapp.errors import DomainError
    from webapp.tenants.services import create_api_key

    key, _ = create_api_key(manager.org, "by hand", created_by=manager.admin, scopes=MANAGE)
    assert key.parent_id is None and key.expires_at is None and key.requests_per_minute is None
    viewer = member(manager, "viewer")
    with pytest.raises(DomainError) as refused:
        create_api_key(manager.org, "too much", created_by=viewer, scopes=["speech:read"])
    assert refused.value.code == "permission_denied"


def test_a_deactivated_users_keys_stop_working(manager: Any) -> None:
    assert manager.manager.get("/api/v1/voices").status_code == 200
    manager.admin.is_active = False
    manager.admin.save(update_fields=["is_active"])
    response = manager.manager.get("/api/v1/voices")
    assert response.status_code == 401 and problem(response)["status"] == 401
    assert manager.manager.post("/api/v1/keys", {"name": "escape"}).status_code == 401
    manager.admin.is_active = True
    manager.admin.save(update_fields=["is_active"])
    assert manager.manager.get("/api/v1/voices").status_code == 200  # the key itself was never revoked


def test_a_removed_members_keys_stop_working(manager: Any) -> None:
    from webapp.tenants.models import Membership

    assert manager.manager.get("/api/v1/voices").status_code == 200
    Membership.objects.filter(user=manager.admin, organization=manager.org).delete()
    assert manager.manager.get("/api/v1/voices").status_code == 401


def test_the_key_lookup_stays_one_query(manager: Any, django_assert_num_queries: Any) -> None:
    from webapp.tenants.services import find_api_key

    raw = manager.manager.raw_key
    assert raw is not None
    with django_assert_num_queries(1):
        found = find_api_key(raw)
    assert found is not None and found.holder_role == "admin"  # type: ignore[attr-defined]
