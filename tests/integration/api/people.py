"""Members with roles and the keys that act for them, for the keys and roles tests."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import ApiClient, Tenant


def member(tenant: Tenant, role: str) -> Any:
    """A new user with ``role`` in the tenant."""
    from django.contrib.auth import get_user_model

    from webapp.tenants.models import Membership

    user = get_user_model().objects.create_user(f"{role}-{tenant.org.slug}-{Membership.objects.count()}")
    Membership.objects.create(user=user, organization=tenant.org, role=role)
    return user


def key_for(tenant: Tenant, user: Any, scopes: list[str], role: str | None = None) -> ApiClient:
    """A key acting for ``user`` (None: a tenant key), issued by the operator.

    With ``role``, the user is made that role *after* the key is issued, so a
    key can carry scopes its user's role no longer allows (as after a demotion).
    """
    from webapp.tenants.models import Membership
    from webapp.tenants.services import OPERATOR, create_api_key

    membership = Membership.objects.filter(user=user, organization=tenant.org)
    if role is not None:
        membership.update(role=Membership.Role.ADMIN)
    _, raw = create_api_key(tenant.org, "role key", created_by=OPERATOR, user=user, scopes=scopes)
    if role is not None:
        membership.update(role=role)
    return ApiClient(raw)
