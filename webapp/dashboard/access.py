"""Who is asking and for which organisation: every dashboard page goes through ``tenant_page``.

A signed-in person works in one organisation at a time (the session keeps
which; the first membership otherwise). Roles decide what a page shows and
accepts; the tenants services check them again when state changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from webapp.dashboard.accounts import confirmed_totp, needs_verification
from webapp.errors import DomainError
from webapp.problems import Problem
from webapp.tenants.models import Membership, Organization
from webapp.tenants.roles import MANAGER_ROLES

SESSION_ORG = "dashboard_org"
MANAGERS = MANAGER_ROLES
# Roles that may submit and delete jobs (a read-only viewer role only looks).
WRITERS = (Membership.Role.OWNER, Membership.Role.ADMIN, Membership.Role.MEMBER)


@dataclass(frozen=True)
class Tenant:
    organization: Organization
    role: str
    memberships: list[Membership]

    @property
    def can_manage(self) -> bool:
        return self.role in MANAGERS

    @property
    def can_write(self) -> bool:
        return self.role in WRITERS


def current_tenant(request: HttpRequest) -> Tenant | None:
    memberships = list(
        Membership.objects.filter(user_id=cast(int, request.user.pk), organization__is_active=True)
        .select_related("organization__plan")
        .order_by("created_at", "pk")
    )
    if not memberships:
        return None
    wanted = request.session.get(SESSION_ORG)
    chosen = next((m for m in memberships if str(m.organization_id) == wanted), memberships[0])
    return Tenant(chosen.organization, chosen.role, memberships)


def owner_needs_totp(request: HttpRequest, tenant: Tenant) -> bool:
    """An owner on a plan that asks for a second factor must enrol one before anything else."""
    plan_requires = tenant.organization.plan.owners_need_totp
    return plan_requires and tenant.role == Membership.Role.OWNER and confirmed_totp(request.user) is None


def error_text(exc: Exception) -> str:
    """The human sentence of a service error."""
    if isinstance(exc, DomainError):
        return exc.message
    if isinstance(exc, Problem):
        return str(exc.detail)
    return str(exc)


Page = Callable[..., HttpResponse]


def tenant_page(*, roles: tuple[str, ...] | None = None, verified: bool = False) -> Callable[[Page], Page]:
    """Sign-in, organisation, second-factor and role checks; the view gets ``tenant`` as its 2nd argument.

    ``verified``: the page creates keys or jobs, which open sign-up allows
    only after the e-mail address is confirmed.
    """

    def decorate(view: Page) -> Page:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            tenant = current_tenant(request)
            if tenant is None:
                messages.error(
                    request, "Your account belongs to no organisation; ask an owner to invite you."
                )
                return redirect("dashboard:account")
            if owner_needs_totp(request, tenant):
                messages.warning(
                    request, "Your plan requires owners to use a second factor; set it up first."
                )
                return redirect("dashboard:security")
            if verified and needs_verification(request.user):
                messages.warning(request, "Confirm your e-mail address first: follow the link we sent you.")
                return redirect("dashboard:account")
            if roles is not None and tenant.role not in roles:
                return render(request, "dashboard/forbidden.html", {"tenant": tenant}, status=403)
            return view(request, tenant, *args, **kwargs)

        return wrapper

    return decorate
