"""State changes of tenants, members and API keys."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from webapp.problems import Problem
from webapp.tenants.models import ApiKey, Membership, Organization, Plan

KEY_RE = re.compile(r"^tts_([A-Za-z0-9]{8})_([A-Za-z0-9_-]{20,128})$")
_PREFIX_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def hash_secret(secret: str) -> str:
    return hmac.new(settings.API_KEY_HMAC_SECRET.encode(), secret.encode(), hashlib.sha256).hexdigest()


def default_plan() -> Plan:
    # The migration creates it; get_or_create keeps tests that flush tables working.
    plan, _ = Plan.objects.get_or_create(is_default=True, defaults={"slug": "free", "name": "Free"})
    return plan


@transaction.atomic
def create_organization(
    name: str, *, owner: Any = None, plan: Plan | None = None, slug: str | None = None
) -> Organization:
    base = slug or slugify(name)[:40] or "org"
    candidate, n = base, 1
    while Organization.objects.filter(slug=candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    org = Organization.objects.create(name=name, slug=candidate, plan=plan or default_plan())
    if owner is not None:
        Membership.objects.create(user=owner, organization=org, role=Membership.Role.OWNER)
    return org


@transaction.atomic
def create_api_key(
    organization: Organization,
    name: str,
    *,
    scopes: list[str] | None = None,
    created_by: Any = None,
    expires_at: dt.datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its full secret, which is never stored or shown again.

    ``created_by`` (a user) must be an owner or admin of the organization.
    """
    if created_by is not None:
        require_role(created_by, organization, KEY_MANAGER_ROLES)
    unknown = sorted(set(scopes or []) - set(ApiKey.ALL_SCOPES))
    if unknown:
        raise Problem(400, "invalid_scope", f"Unknown scope(s): {', '.join(unknown)}.", field="scopes")
    while True:
        prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(8))
        if not ApiKey.objects.filter(prefix=prefix).exists():
            break
    secret = secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        organization=organization,
        name=name,
        prefix=prefix,
        secret_hash=hash_secret(secret),
        scopes=list(scopes if scopes is not None else ApiKey.ALL_SCOPES),
        created_by=created_by,
        expires_at=expires_at,
    )
    return key, f"tts_{prefix}_{secret}"


def find_api_key(raw: str) -> ApiKey | None:
    """The usable key for a presented token, or None. Compares in constant time."""
    match = KEY_RE.match(raw)
    if not match:
        return None
    prefix, secret = match.groups()
    key = ApiKey.objects.select_related("organization__plan").filter(prefix=prefix).first()
    expected = key.secret_hash if key is not None else hash_secret("no-such-key")
    valid = hmac.compare_digest(expected, hash_secret(secret))
    if key is None or not valid or not key.is_usable() or not key.organization.is_active:
        return None
    return key


def touch_api_key(key: ApiKey) -> None:
    """Record use, at most once a minute per key to spare the database."""
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > dt.timedelta(seconds=60):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now


@transaction.atomic
def revoke_api_key(key: ApiKey, *, by: Any = None) -> None:
    """Revoke a key; ``by`` (a user), when given, must be an owner or admin of the key's tenant."""
    if by is not None:
        require_role(by, key.organization, KEY_MANAGER_ROLES)
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


# Roles (issue 5): the owner manages members, plan and keys; an admin manages
# keys and voices; a member submits and sees the tenant's history.
KEY_MANAGER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)
VOICE_MANAGER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)
MEMBER_MANAGER_ROLES = (Membership.Role.OWNER,)


def role_of(user: Any, organization: Organization) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "pk", None):
        return None
    return (
        Membership.objects.filter(user_id=user.pk, organization=organization)
        .values_list("role", flat=True)
        .first()
    )


def require_role(user: Any, organization: Organization, roles: tuple[str, ...]) -> str:
    """The user's role in the organization, or a Problem: 404 for outsiders, 403 for too low a role."""
    role = role_of(user, organization)
    if role is None:
        raise Problem(404, "not_found", "No such organization.")
    if role not in roles:
        raise Problem(
            403,
            "permission_denied",
            f"Your role ({role}) cannot do this; it needs {' or '.join(roles)}.",
        )
    return role
