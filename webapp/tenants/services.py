"""State changes of tenants, members and API keys.

Key management always checks who acts. The actor is a user (their role in
the tenant), an API key (its user's role and the ``keys:manage`` scope), or
:data:`OPERATOR`: the people running the service (the admin site, management
commands), who stand outside every tenant and say so explicitly.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from webapp.audit import services as audit
from webapp.errors import DomainError, ErrorCode
from webapp.provisioning import missing_secret
from webapp.rawrows import columns, fetch_one
from webapp.tenants import roles
from webapp.tenants.models import ApiKey, Membership, Organization, Plan

KEY_RE = re.compile(r"^tts_([A-Za-z0-9]{8})_([A-Za-z0-9_-]{20,128})$")
_PREFIX_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class Operator:
    """The service's operators: they issue and revoke keys for any tenant."""

    def __repr__(self) -> str:
        return "OPERATOR"


OPERATOR = Operator()


def hash_secret(secret: str) -> str:
    key = settings.API_KEY_HMAC_SECRET
    if not key:  # never hash with an empty key: the error names the variable and `manage.py prepare_var`
        raise missing_secret("API_KEY_HMAC_SECRET")
    return hmac.new(key.encode(), secret.encode(), hashlib.sha256).hexdigest()


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
    created_by: Any,
    user: Any = None,
    scopes: list[str] | None = None,
    expires_at: dt.datetime | None = None,
    requests_per_minute: int | None = None,
    monthly_characters: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its full secret, which is never stored or shown again.

    ``created_by`` must be an owner or admin of the organization (a user, or a
    key acting for one), or :data:`OPERATOR`. A user's or a key's new key acts
    for the same user; only the operator may issue a key for another member
    (``user``) or for the tenant as a whole (no user). Without ``scopes`` the
    key gets read and speech, never key management.

    A key created by a key (its ``parent``) is bounded by it: no scope the
    parent lacks, no later expiry, no higher rate or monthly characters; left
    out, the expiry, the rate and the monthly characters are the parent's, and the default scopes are those of the default the
    parent carries. Revoking the parent revokes it (:func:`revoke_api_key`).
    A person's key is bounded by the person's role only.
    """
    _require_key_manager(created_by, organization)
    holder, holder_role = _holder(created_by, organization, user)
    parent = created_by if isinstance(created_by, ApiKey) else None
    if parent is not None and scopes is None:
        scopes = _default_scopes_within(parent)
    granted = _granted_scopes(scopes, holder_role)
    if requests_per_minute is not None and requests_per_minute < 1:
        raise DomainError(
            ErrorCode.INVALID_REQUEST, "requests_per_minute must be at least 1.", field="requests_per_minute"
        )
    if monthly_characters is not None and monthly_characters < 1:
        raise DomainError(
            ErrorCode.INVALID_REQUEST, "monthly_characters must be at least 1.", field="monthly_characters"
        )
    if parent is not None:
        _lock_unrevoked(parent)
        expires_at, requests_per_minute = _bounded_by_parent(parent, granted, expires_at, requests_per_minute)
        monthly_characters = _cap_within_parent(parent, monthly_characters)
    prefix = _unused_prefix()
    secret = secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        organization=organization,
        name=name,
        prefix=prefix,
        secret_hash=hash_secret(secret),
        scopes=granted,
        user=holder,
        created_by=_user_of(created_by),
        parent=parent,
        expires_at=expires_at,
        requests_per_minute=requests_per_minute,
        monthly_characters=monthly_characters,
    )
    details: dict[str, Any] = {"scopes": granted}
    if parent is not None:
        details["parent"] = str(parent.pk)
    audit.record("key.created", target=key, organization=organization, actor=created_by, details=details)
    return key, f"tts_{prefix}_{secret}"


@transaction.atomic
def revoke_api_key(key: ApiKey, *, by: Any) -> None:
    """Revoke a key and the keys it created, and theirs; ``by`` must be an owner or admin (or OPERATOR).

    The tree is revoked here, once, so that the lookup every request makes
    (:func:`_key_by_prefix`) reads one row and never walks up to the parents.
    The key's row is updated first: a child being created at the same moment
    (which locks its parent, :func:`_lock_unrevoked`) is either refused or
    committed before the children are looked for.
    """
    _require_key_manager(by, key.organization)
    now = timezone.now()
    if ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now):
        audit.record("key.revoked", target=key, organization=key.organization_id, actor=by)
    generation = [key.pk]
    while generation:  # a key's parent is always an older key: the tree has no cycles and this ends
        children = list(
            ApiKey.objects.filter(parent_id__in=generation).only("pk", "name", "prefix", "revoked_at")
        )
        for child in children:
            if child.revoked_at is None and ApiKey.objects.filter(
                pk=child.pk, revoked_at__isnull=True
            ).update(revoked_at=now):
                details = {"with_parent": str(key.pk)}
                audit.record(
                    "key.revoked", target=child, organization=key.organization_id, actor=by, details=details
                )
        generation = [child.pk for child in children]


# The longest a rotated-out secret may keep working.
MAX_ROTATION_OVERLAP = dt.timedelta(days=30)


@transaction.atomic
def rotate_api_key(key: ApiKey, *, by: Any, overlap: dt.timedelta) -> str:
    """A new secret for the same key (its id, prefix, scopes, cap and the keys it created stay);
    the current secret keeps working for ``overlap`` (0: stops at once), then is refused.

    A secret rotated out earlier and still in its overlap stops now: two secrets at most.
    Returns the full new key, shown once.
    """
    _require_key_manager(by, key.organization)
    _require_rotator(by, key)
    if overlap < dt.timedelta(0) or overlap > MAX_ROTATION_OVERLAP:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            f"The overlap is from 0 to {MAX_ROTATION_OVERLAP.days} days.",
            field="overlap_seconds",
        )
    locked = ApiKey.objects.select_for_update().filter(pk=key.pk, revoked_at__isnull=True).first()
    if locked is None:
        raise DomainError(ErrorCode.INVALID_REQUEST, "A revoked key cannot be rotated.")
    now = timezone.now()
    secret = secrets.token_urlsafe(32)
    changes = {
        "secret_hash": hash_secret(secret),
        "previous_secret_hash": locked.secret_hash if overlap else "",
        "previous_valid_until": now + overlap if overlap else None,
        "rotated_at": now,
    }
    ApiKey.objects.filter(pk=key.pk).update(**changes)
    for name, value in changes.items():
        setattr(key, name, value)
    details: dict[str, Any] = {"overlap_seconds": int(overlap.total_seconds())}
    if _is_user(by) and key.user_id is not None and key.user_id != by.pk:
        details["holder"] = key.user_id  # an owner rotated a member's key: the holder is told
        rotated_by, key_id = str(by), key.pk
        transaction.on_commit(lambda: _tell_holder(key_id, rotated_by), robust=True)
    audit.record("key.rotated", target=key, organization=key.organization, actor=by, details=details)
    return f"tts_{key.prefix}_{secret}"


def _require_rotator(by: Any, key: ApiKey) -> None:
    """Who rotates a key sees its new secret, so: its holder, or an owner (audited, the holder told);
    a key rotates itself and the keys it created. An admin never sees another member's secret."""
    if by is OPERATOR:
        return
    if isinstance(by, ApiKey):
        if by.pk != key.pk and not _descends_from(key, by):
            raise DomainError(
                ErrorCode.PERMISSION_DENIED, "A key rotates only itself and the keys it created."
            )
        return
    if key.user_id is not None and key.user_id == by.pk:
        return
    if roles.role_of(by, key.organization) != roles.Role.OWNER:
        raise DomainError(
            ErrorCode.PERMISSION_DENIED,
            "Only the key's holder or an owner may rotate it: the new secret is shown to whoever rotates it.",
        )


def _tell_holder(key_id: Any, rotated_by: str) -> None:
    key = ApiKey.objects.select_related("user", "organization").filter(pk=key_id).first()
    if key is None or key.user is None or not key.user.email:
        return
    until = (
        f"The old secret keeps working until {key.previous_valid_until:%Y-%m-%d %H:%M} UTC."
        if key.previous_valid_until
        else "The old secret no longer works."
    )
    body = (
        f"{rotated_by}, an owner of {key.organization.name}, rotated your API key {key.name} "
        f"(tts_{key.prefix}_...). {until}\n\nThey were shown the new secret; you were not. "
        "Rotate the key yourself in the dashboard (Keys) to get a secret only you know.\n"
    )
    send_mail(f"Your API key {key.name} was rotated", body, settings.DEFAULT_FROM_EMAIL, [key.user.email])


def _descends_from(key: ApiKey, ancestor: ApiKey) -> bool:
    parent_id = key.parent_id
    while parent_id is not None:
        if parent_id == ancestor.pk:
            return True
        parent_id = ApiKey.objects.filter(pk=parent_id).values_list("parent_id", flat=True).first()
    return False


def _secret_matches(key: ApiKey | None, secret: str) -> str | None:
    """ "current", or "previous" (the secret before a rotation, while its overlap lasts), or None;
    constant time."""
    presented = hash_secret(secret)
    current = key.secret_hash if key is not None else hash_secret("no-such-key")
    valid = hmac.compare_digest(current, presented)
    previous = key.previous_secret_hash if key is not None else ""
    until = key.previous_valid_until if key is not None else None
    still = bool(previous) and until is not None and until > timezone.now()
    # Compared whether or not it still counts, so the time taken tells nothing either way.
    matches_previous = hmac.compare_digest(previous or current, presented)
    if valid:
        return "current"
    return "previous" if still and matches_previous else None


def find_api_key(raw: str) -> ApiKey | None:
    """The usable key for a presented token, or None. Compares in constant time.

    The key comes with its tenant and plan, and with ``holder_role``: its user's
    current role in the tenant (None when that user is no longer a member,
    which makes the key unusable). A key acts for its user: one whose user is
    inactive (``is_active`` off) is unusable too.
    """
    match = KEY_RE.match(raw)
    if not match:
        return None
    prefix, secret = match.groups()
    key = _key_by_prefix(prefix)
    matched = _secret_matches(key, secret)
    if key is None or matched is None or not key.is_usable() or not key.organization.is_active:
        return None
    if key.user_id is not None and (key.holder_role is None or not key.holder_active):  # type: ignore[attr-defined]
        return None
    # A secret rotated out authenticates until its overlap ends, but manages no key (_require_key_manager):
    # one leaked during the overlap cannot rotate the key again and keep it.
    key.by_previous_secret = matched == "previous"  # type: ignore[attr-defined]
    return key


def _key_by_prefix(prefix: str) -> ApiKey | None:
    """The key with this prefix, with its tenant, plan, ``holder_role`` and ``holder_active``, in one query.

    ``holder_role`` is the key's user's role in the tenant as it is now (None
    for a tenant key, or when that user is no longer a member);
    ``holder_active`` the user's ``is_active`` (None for a tenant key). Every
    authenticated request runs it: as a queryset (two select_related joins and
    a subquery) it cost 2.2 ms more CPU per call than this statement
    (tests/bench/bench_queries.py), which a request pays once or more.
    """
    k, o, p = columns(ApiKey, "k"), columns(Organization, "o"), columns(Plan, "p")
    users = get_user_model()._meta.db_table
    row = fetch_one(
        f"""SELECT {k.sql}, {o.sql}, {p.sql},
            (SELECT m.role FROM {Membership._meta.db_table} m
             WHERE m.user_id = k.user_id AND m.organization_id = k.organization_id LIMIT 1),
            u.is_active
        FROM {k.table} JOIN {o.table} ON o.id = k.organization_id JOIN {p.table} ON p.id = o.plan_id
        LEFT JOIN {users} u ON u.id = k.user_id
        WHERE k.prefix = %s""",
        [prefix],
    )
    if row is None:
        return None
    key: ApiKey = k.build(row)
    key.organization = o.build(row, len(k))
    key.organization.plan = p.build(row, len(k) + len(o))
    key.holder_role = row[-2]  # type: ignore[attr-defined]
    key.holder_active = row[-1]  # type: ignore[attr-defined]
    return key


def key_role(key: ApiKey) -> str | None:
    """The role a key acts with: its user's (as found by find_api_key), or the tenant key's."""
    if key.user_id is None:
        return roles.TENANT_KEY_ROLE
    found = getattr(key, "holder_role", None)
    return found if found is not None else roles.role_of(key.user, key.organization)


def touch_api_key(key: ApiKey, address: str | None = None) -> None:
    """Record use and the client's address, at most once a minute per key to spare the database."""
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > dt.timedelta(seconds=60):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now, last_used_ip=address or None)
        key.last_used_at = now
        key.last_used_ip = address or None


# ----------------------------------------------------------------------------- helpers


def _is_user(actor: Any) -> bool:
    return not isinstance(actor, ApiKey | Operator) and getattr(actor, "is_authenticated", False)


def _user_of(actor: Any) -> Any:
    """The user behind an actor: the user, a key's user, or None for the operator."""
    if isinstance(actor, ApiKey):
        return actor.user
    return actor if _is_user(actor) else None


def _require_key_manager(actor: Any, organization: Organization) -> None:
    """Refuse anyone but an owner or admin of the organization (or the operator)."""
    if actor is OPERATOR:
        return
    if isinstance(actor, ApiKey):
        if actor.organization_id != organization.pk:
            raise DomainError(ErrorCode.NOT_FOUND, "No such organization.")
        if getattr(actor, "by_previous_secret", False):
            raise DomainError(
                ErrorCode.PERMISSION_DENIED,
                "This key's secret was rotated out: it still authenticates until its overlap ends, "
                "but manages no key. Use the current secret.",
            )
        if ApiKey.Scope.KEYS_MANAGE not in (actor.scopes or []):
            raise DomainError(ErrorCode.PERMISSION_DENIED, "This API key lacks the 'keys:manage' scope.")
        role = key_role(actor)
        if role is None:
            raise DomainError(ErrorCode.PERMISSION_DENIED, "This key's user is no longer a member.")
        roles.require_one_of(role, roles.MANAGER_ROLES)
        return
    if not _is_user(actor):
        raise DomainError(ErrorCode.PERMISSION_DENIED, "Managing keys needs a signed-in owner or admin.")
    roles.require_role(actor, organization, roles.MANAGER_ROLES)


def _holder(actor: Any, organization: Organization, user: Any) -> tuple[Any, str]:
    """The user the new key acts for, and that user's role (the tenant key's role for no user)."""
    if actor is OPERATOR:
        holder = user
    else:
        holder = _user_of(actor)
        if user is not None and user != holder:
            raise DomainError(ErrorCode.PERMISSION_DENIED, "Only the operator issues keys for other members.")
    if holder is None:
        return None, roles.TENANT_KEY_ROLE
    role = roles.role_of(holder, organization)
    if role is None:
        raise DomainError(ErrorCode.INVALID_REQUEST, f"{holder} is not a member of {organization}.")
    return holder, role


def _granted_scopes(asked: list[str] | None, holder_role: str) -> list[str]:
    """The scopes to grant, after refusing any the key could not have or could never use."""
    scopes = list(dict.fromkeys(asked)) if asked is not None else list(ApiKey.DEFAULT_SCOPES)
    unknown = sorted(set(scopes) - set(ApiKey.ALL_SCOPES))
    if unknown:
        raise DomainError(
            ErrorCode.INVALID_SCOPE,
            f"Unknown scope(s): {', '.join(unknown)}; known: {', '.join(ApiKey.ALL_SCOPES)}.",
            field="scopes",
        )
    beyond = roles.scopes_beyond_role(holder_role, scopes)
    if beyond:
        raise DomainError(
            ErrorCode.INVALID_SCOPE,
            f"A key acting for a {holder_role} cannot carry {', '.join(beyond)}.",
            field="scopes",
        )
    return scopes


def _lock_unrevoked(parent: ApiKey) -> None:
    """Lock the creating key's row until the new key is committed; refuse if it was revoked meanwhile.

    :func:`revoke_api_key` updates that row before it looks for children, so the
    new key is either refused here or found (and revoked) there.
    """
    if not ApiKey.objects.select_for_update().filter(pk=parent.pk, revoked_at__isnull=True).exists():
        raise DomainError(ErrorCode.PERMISSION_DENIED, "The key creating this one has just been revoked.")


def _cap_within_parent(parent: ApiKey, monthly_characters: int | None) -> int | None:
    """The new key's monthly characters within its creator's: the parent's when left out; refused above it."""
    if parent.monthly_characters is None:
        return monthly_characters
    if monthly_characters is None:
        return parent.monthly_characters
    if monthly_characters > parent.monthly_characters:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            f"monthly_characters may be at most {parent.monthly_characters:,}, "
            "the cap of the key creating this one.",
            field="monthly_characters",
        )
    return monthly_characters


def _default_scopes_within(parent: ApiKey) -> list[str]:
    """The default scopes, less those the creating key lacks; refused when that leaves none."""
    scopes = [scope for scope in ApiKey.DEFAULT_SCOPES if scope in (parent.scopes or [])]
    if not scopes:
        raise DomainError(
            ErrorCode.INVALID_SCOPE,
            f"The key creating this one carries none of the default scopes ({', '.join(ApiKey.DEFAULT_SCOPES)}); "
            "name the scopes, among those it carries.",
            field="scopes",
        )
    return scopes


def _bounded_by_parent(
    parent: ApiKey, scopes: list[str], expires_at: dt.datetime | None, requests_per_minute: int | None
) -> tuple[dt.datetime | None, int | None]:
    """The new key's expiry and rate within the creating key's; refuse scopes, expiry or rate beyond it."""
    beyond = sorted(set(scopes) - set(parent.scopes or []))
    if beyond:
        raise DomainError(
            ErrorCode.INVALID_SCOPE,
            f"The key creating this one does not carry {', '.join(beyond)}; "
            "a key never carries scopes beyond the key that creates it.",
            field="scopes",
        )
    if parent.expires_at is not None:
        if expires_at is None:
            expires_at = parent.expires_at
        elif expires_at > parent.expires_at:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"expires_at may be at most {parent.expires_at.isoformat()}, "
                "when the key creating this one expires.",
                field="expires_at",
            )
    if parent.requests_per_minute is not None:
        if requests_per_minute is None:
            requests_per_minute = parent.requests_per_minute
        elif requests_per_minute > parent.requests_per_minute:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"requests_per_minute may be at most {parent.requests_per_minute}, "
                "the rate of the key creating this one.",
                field="requests_per_minute",
            )
    return expires_at, requests_per_minute


def _unused_prefix() -> str:
    while True:
        prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(8))
        if not ApiKey.objects.filter(prefix=prefix).exists():
            return prefix
