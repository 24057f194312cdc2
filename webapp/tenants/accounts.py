"""People in organisations: sign-up, invitations, roles and removal.

The dashboard calls these; each is one transaction and checks the acting
user's role itself, so no caller can skip the check. An organisation always
keeps at least one owner. Invitations, joins, role changes and removals are
audited.

An invitation is a pending :class:`Invitation` row, never an account: the
invited person chooses a password through the mailed link, or signs in to the
account their address already has, and only then becomes a member. Nothing
here tells the inviter whether an address is registered.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from webapp.audit import services as audit
from webapp.errors import DomainError, ErrorCode
from webapp.tenants import hourly
from webapp.tenants.models import Invitation, Membership, Organization
from webapp.tenants.roles import MANAGER_ROLES, require_role
from webapp.tenants.services import create_organization, hash_secret

# Owners and admins manage people (MANAGER_ROLES); only an owner hands out or takes away ownership.


def _denied(message: str) -> DomainError:
    return DomainError(ErrorCode.PERMISSION_DENIED, message)


def find_user_by_email(email: str) -> Any:
    return get_user_model().objects.filter(email__iexact=email.strip()).order_by("pk").first()


@transaction.atomic
def sign_up(*, email: str, password: str, organization_name: str) -> tuple[Any, Organization]:
    """A new user with a new organisation they own. The e-mail is the user name."""
    email = email.strip().lower()
    if find_user_by_email(email) is not None:
        raise DomainError(
            ErrorCode.INVALID_REQUEST, "An account with this e-mail address exists.", field="email"
        )
    user = get_user_model().objects.create_user(username=email, email=email, password=password)
    organization = create_organization(organization_name or email.split("@")[0], owner=user)
    return user, organization


def _require_manager(by: Any, organization: Organization) -> str:
    return require_role(by, organization, MANAGER_ROLES)


def _check_grant(acting_role: str, role: str) -> None:
    if role not in Membership.Role.values:
        raise DomainError(ErrorCode.INVALID_REQUEST, f"Unknown role {role!r}.", field="role")
    if role == Membership.Role.OWNER and acting_role != Membership.Role.OWNER:
        raise _denied("Only an owner can make someone an owner.")


@transaction.atomic(durable=True)
def invite_member(organization: Organization, email: str, role: str, *, by: Any) -> tuple[Invitation, str]:
    """Invite an address with a role: the pending row and the secret of its link (for the mail only).

    No account is looked up or made, so the answer is the same whether the
    address has one. Limited per inviter and per tenant each hour; inviting
    the same address again replaces the link.
    """
    _check_grant(_require_manager(by, organization), role)
    email = email.strip().lower()
    if Membership.objects.filter(organization=organization, user__email__iexact=email).exists():
        # The inviter sees the members already: this tells them nothing new.
        raise DomainError(ErrorCode.INVALID_REQUEST, f"{email} is already a member.", field="email")
    budgets = [
        (f"invite:user:{by.pk}", settings.TTS_INVITATIONS_PER_INVITER_HOURLY),
        (f"invite:org:{organization.pk}", settings.TTS_INVITATIONS_PER_TENANT_HOURLY),
    ]
    if not hourly.spend(budgets):
        raise DomainError(ErrorCode.RATE_LIMITED, "Too many invitations in the last hour; try again later.")
    raw = secrets.token_urlsafe(32)
    now = timezone.now()
    invitation, _ = Invitation.objects.update_or_create(
        organization=organization,
        email=email,
        defaults={
            "role": role,
            "token_hash": hash_secret(raw),
            "invited_by": by,
            "created_at": now,
            "expires_at": now + dt.timedelta(days=settings.TTS_INVITATION_DAYS),
        },
    )
    audit.record(
        "member.invited", target=invitation, organization=organization, details={"email": email, "role": role}
    )
    return invitation, raw


def _unexpired(raw: str) -> Any:
    return Invitation.objects.filter(token_hash=hash_secret(raw), expires_at__gt=timezone.now())


def find_invitation(raw: str) -> Invitation | None:
    """The pending, unexpired invitation whose link carries ``raw``."""
    return _unexpired(raw).select_related("organization", "invited_by").first()


def _pending(raw: str) -> Invitation:
    """The invitation, locked: two tabs following one link join once."""
    found = _unexpired(raw).select_for_update(of=("self",)).select_related("organization").first()
    if found is None:
        raise DomainError(ErrorCode.NOT_FOUND, "This invitation link is invalid, expired or already used.")
    return found


def _join(invitation: Invitation, user: Any) -> Membership:
    membership, _ = Membership.objects.get_or_create(
        user=user, organization=invitation.organization, defaults={"role": invitation.role}
    )
    invitation.delete()
    audit.record(
        "invitation.accepted",
        target=membership,
        organization=invitation.organization,
        actor=user,
        details={"email": invitation.email, "role": membership.role},
    )
    return membership


@transaction.atomic(durable=True)
def accept_invitation(raw: str, user: Any) -> Membership:
    """A signed-in user joins through a link sent to their own address."""
    invitation = _pending(raw)
    if str(user.email).strip().lower() != invitation.email:
        raise _denied("This invitation is for another address; sign in with that address to accept it.")
    return _join(invitation, user)


@transaction.atomic(durable=True)
def join_with_password(raw: str, password: str) -> Any:
    """A new account for the invited address, with the password its owner chose, and its membership.

    Following the link proves the address. An address that has an account
    already joins by signing in (:func:`accept_invitation`): the link never
    sets the password of an existing account.
    """
    invitation = _pending(raw)
    if find_user_by_email(invitation.email) is not None:
        raise DomainError(ErrorCode.INVALID_REQUEST, "This address has an account: sign in to accept.")
    try:
        with transaction.atomic():
            user = get_user_model().objects.create_user(
                username=invitation.email, email=invitation.email, password=password
            )
    except IntegrityError as exc:  # the same address signed up a moment ago
        raise DomainError(
            ErrorCode.INVALID_REQUEST, "This address has an account: sign in to accept."
        ) from exc
    _join(invitation, user)
    return user


@transaction.atomic(durable=True)
def withdraw_invitation(invitation: Invitation, *, by: Any) -> None:
    acting = _require_manager(by, invitation.organization)
    if invitation.role == Membership.Role.OWNER and acting != Membership.Role.OWNER:
        raise _denied("Only an owner can withdraw an invitation to be an owner.")
    audit.record(
        "invitation.withdrawn",
        target=invitation,
        organization=invitation.organization,
        details={"email": invitation.email, "role": invitation.role},
    )
    invitation.delete()


def _lock_owners(organization: Organization) -> int:
    """The number of owners, with their rows locked so two removals cannot race past the last one."""
    owners = Membership.objects.select_for_update().filter(
        organization=organization, role=Membership.Role.OWNER
    )
    return len(list(owners))


def _check_may_touch(acting_role: str, membership: Membership) -> None:
    if membership.role == Membership.Role.OWNER:
        if acting_role != Membership.Role.OWNER:
            raise _denied("Only an owner can change or remove an owner.")
        if _lock_owners(membership.organization) <= 1:
            raise _denied("An organisation needs at least one owner; make someone else owner first.")


@transaction.atomic
def change_role(membership: Membership, role: str, *, by: Any) -> Membership:
    acting = _require_manager(by, membership.organization)
    _check_grant(acting, role)
    if role != membership.role:
        _check_may_touch(acting, membership)
        before = membership.role
        membership.role = role
        membership.save(update_fields=["role"])
        audit.record(
            "member.role_changed",
            target=membership,
            organization=membership.organization,
            details={"from": before, "to": role},
        )
    return membership


@transaction.atomic
def remove_member(membership: Membership, *, by: Any) -> None:
    acting = _require_manager(by, membership.organization)
    _check_may_touch(acting, membership)
    audit.record(
        "member.removed",
        target=membership,
        organization=membership.organization,
        details={"email": membership.user.email, "role": membership.role},
    )
    membership.delete()
