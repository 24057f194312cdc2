"""The page behind an invitation's link: who invited to what, then join.

The link's holder proves the address. Without an account for it they choose
a password here (a new account, already confirmed, and the membership); an
address that has an account joins by signing in to it and accepting, so the
link never changes an existing account's password. Only the holder of the
link learns whether the address has an account; the inviter never does.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from webapp.dashboard.access import SESSION_ORG, error_text
from webapp.dashboard.forms import JoinForm
from webapp.dashboard.views.public import PASSWORD_BACKEND
from webapp.errors import DomainError
from webapp.tenants import accounts as people
from webapp.tenants.models import Membership

INVALID = "This invitation link is invalid, expired or already used."


def _joined(request: HttpRequest, membership: Membership) -> HttpResponse:
    request.session[SESSION_ORG] = str(membership.organization_id)
    messages.success(request, f"You are now a {membership.role} of {membership.organization.name}.")
    return redirect("dashboard:synthesize")


@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    found = people.find_invitation(token)
    if found is None:
        return render(request, "dashboard/link_error.html", {"error": INVALID}, status=400)
    user: Any = request.user
    signed_in_as_invited = user.is_authenticated and str(user.email).lower() == found.email
    has_account = signed_in_as_invited or people.find_user_by_email(found.email) is not None
    form = None if has_account else JoinForm(request.POST or None)
    status = 200
    if request.method == "POST":
        try:
            if signed_in_as_invited:
                return _joined(request, people.accept_invitation(token, user))
            if form is not None and form.is_valid():
                new_user = people.join_with_password(token, form.cleaned_data["new_password1"])
                login(request, new_user, backend=PASSWORD_BACKEND)
                return _joined(request, new_user.memberships.get(organization=found.organization))
        except DomainError as exc:
            return render(request, "dashboard/link_error.html", {"error": error_text(exc)}, status=400)
        status = 400 if form is not None else 403
    login_url = f"{reverse('dashboard:login')}?{urlencode({'next': request.path})}"
    context = {
        "invitation": found,
        "form": form,
        "has_account": has_account,
        "signed_in_as_invited": signed_in_as_invited,
        "login_url": login_url,
    }
    response = render(request, "dashboard/invitation.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response
