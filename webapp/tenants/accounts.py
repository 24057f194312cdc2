"""People in organisations: sign-up, invitations, roles and removal.

The dashboard calls these; each is one transaction and checks the acting
user's role itself, so no caller can skip the check. An organisation always
keeps at least one owner.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from webapp.errors import DomainError, ErrorCode
from webapp.tenants.models import Membership, Organization
from webapp.tenants.roles import MANAGER_ROLES, require_role
from webapp.tenants.services import create_organization

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


@transaction.atomic
def invite_member(organization: Organization, email: str, role: str, *, by: Any) -> tuple[Membership, bool]:
    """Add a person by e-mail; an unknown address gets an account without a password.

    Returns the membership and whether the account is new (it then needs a
    set-password link).
    """
    _check_grant(_require_manager(by, organization), role)
    email = email.strip().lower()
    user = find_user_by_email(email)
    created = user is None
    if created:
        user = get_user_model().objects.create_user(username=email, email=email, password=None)
    elif Membership.objects.filter(user=user, organization=organization).exists():
        raise DomainError(ErrorCode.INVALID_REQUEST, f"{email} is already a member.", field="email")
    membership = Membership.objects.create(user=user, organization=organization, role=role)
    return membership, created


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
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def remove_member(membership: Membership, *, by: Any) -> None:
    acting = _require_manager(by, membership.organization)
    _check_may_touch(acting, membership)
    membership.delete()
