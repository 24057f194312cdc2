"""Who may do what: members' roles, keys' scopes, and the two together.

A request made with an API key may use a scope only when the key carries it
*and* the role of the key's user allows it, so demoting a user narrows every
key they hold at once, and a key never does more than its user could.
"""

from __future__ import annotations

from typing import Any

from webapp.errors import DomainError, ErrorCode
from webapp.tenants.models import ApiKey, Membership, Organization

Role = Membership.Role
Scope = ApiKey.Scope

ROLE_SCOPES: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset(Scope.values),
    Role.ADMIN: frozenset(Scope.values),
    Role.MEMBER: frozenset({Scope.SPEECH_READ, Scope.SPEECH_WRITE}),
    Role.VIEWER: frozenset({Scope.SPEECH_READ}),
}
# Owners and admins manage keys and may cancel or delete any job of the tenant;
# members only their own user's jobs.
MANAGER_ROLES: tuple[str, ...] = (Role.OWNER, Role.ADMIN)
# A key the operator issued to the tenant as a whole (no user) acts as an admin.
TENANT_KEY_ROLE = Role.ADMIN


def role_of(user: Any, organization: Organization) -> str | None:
    """The user's role in the organization; None for anonymous users and outsiders."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "pk", None):
        return None
    return (
        Membership.objects.filter(user_id=user.pk, organization=organization)
        .values_list("role", flat=True)
        .first()
    )


def require_role(user: Any, organization: Organization, roles: tuple[str, ...]) -> str:
    """The user's role in the organization: not_found for outsiders, permission_denied for too low a role."""
    role = role_of(user, organization)
    if role is None:
        raise DomainError(ErrorCode.NOT_FOUND, "No such organization.")
    require_one_of(role, roles)
    return role


def require_one_of(role: str, roles: tuple[str, ...]) -> None:
    if role not in roles:
        raise DomainError(
            ErrorCode.PERMISSION_DENIED,
            f"Your role ({role}) cannot do this; it needs {' or '.join(roles)}.",
        )


def role_allows(role: str | None, scope: str) -> bool:
    return role is not None and scope in ROLE_SCOPES.get(role, frozenset())


def scopes_beyond_role(role: str, scopes: list[str]) -> list[str]:
    """The scopes a key for this role could carry but never use."""
    return sorted(scope for scope in scopes if not role_allows(role, scope))


def may_touch_all_jobs(role: str | None) -> bool:
    return role in MANAGER_ROLES
