"""Checks the API views run on every request: the key's scope and its user's role."""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from webapp.errors import DomainError, ErrorCode
from webapp.tenants import roles
from webapp.tenants.auth import ApiKeyUser

READ_SCOPE = roles.Scope.SPEECH_READ.value


def required_scope(view: Any, method: str) -> str:
    """The scope a view names for the method (``required_scopes``); reading is the least any call needs."""
    scopes: dict[str, str] = getattr(view, "required_scopes", {})
    return scopes.get("GET" if method == "HEAD" else method, READ_SCOPE)


class RoleScopePermission(permissions.BasePermission):
    """The key must carry the scope the view names for the method, and its user's role must allow it."""

    message = "This API key lacks the scope this endpoint needs."

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, ApiKeyUser):
            return False
        scope = required_scope(view, request.method or "GET")
        if scope not in (principal.key.scopes or []):
            self.message = f"This API key lacks the {scope!r} scope."
            return False
        if not roles.role_allows(principal.role, scope):
            self.message = f"This key acts for a {principal.role}; a {principal.role} cannot use {scope!r}."
            return False
        return True


def require_job_access(principal: Any, owner_user_id: int | None) -> None:
    """Owners and admins may change any job of the tenant; a member's key only its own user's jobs.

    ``owner_user_id`` is the user who created the job (``SynthesisJob.user_id``).
    """
    if not isinstance(principal, ApiKeyUser):
        raise DomainError(ErrorCode.PERMISSION_DENIED, "Changing a job needs an API key.")
    if roles.may_touch_all_jobs(principal.role):
        return
    if owner_user_id is not None and owner_user_id == principal.user_id:
        return
    raise DomainError(
        ErrorCode.PERMISSION_DENIED,
        f"A {principal.role}'s key may cancel or delete only jobs its own user created.",
    )
