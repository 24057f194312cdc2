"""The signed-in person's own settings: e-mail, organisation, second factor."""

from __future__ import annotations

import base64
from typing import Any

import segno
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard import accounts
from webapp.dashboard.access import SESSION_ORG, current_tenant, owner_needs_totp
from webapp.dashboard.forms import CodeForm, EmailChangeForm
from webapp.tenants.accounts import find_user_by_email


@login_required
@require_http_methods(["GET", "POST"])
def account(request: HttpRequest) -> HttpResponse:
    form = EmailChangeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        email = form.cleaned_data["email"].strip().lower()
        if find_user_by_email(email) is not None:
            form.add_error("email", "Another account uses this address.")
        else:
            accounts.start_email_change(request, request.user, email)
            messages.success(
                request, f"We sent a confirmation link to {email}; your address changes once you follow it."
            )
            return redirect("dashboard:account")
    context = {
        "form": form,
        "tenant": current_tenant(request),
        "unverified": accounts.needs_verification(request.user),
        "has_totp": accounts.confirmed_totp(request.user) is not None,
    }
    return render(request, "dashboard/account.html", context)


@login_required
@require_POST
def resend_verification(request: HttpRequest) -> HttpResponse:
    user: Any = request.user
    if accounts.needs_verification(user):
        accounts.start_verification(request, user)
        messages.success(request, f"We sent a new confirmation link to {user.email}.")
    return redirect("dashboard:account")


@login_required
@require_POST
def switch_organization(request: HttpRequest) -> HttpResponse:
    tenant = current_tenant(request)
    wanted = request.POST.get("organization", "")
    if tenant is not None and any(str(m.organization_id) == wanted for m in tenant.memberships):
        request.session[SESSION_ORG] = wanted
    return redirect("dashboard:synthesize")


def _qr_data_uri(url: str) -> str:
    svg = segno.make(url, error="m").svg_inline(scale=5, dark="#000", light="#fff")
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


@login_required
@require_http_methods(["GET", "POST"])
def security(request: HttpRequest) -> HttpResponse:
    """Enrol a TOTP app: a QR code and the secret, confirmed by one code; recovery codes shown once."""
    user = request.user
    if accounts.confirmed_totp(user) is not None:
        return render(request, "dashboard/security.html", {"enrolled": True})
    device = accounts.pending_totp(user)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        codes = accounts.confirm_totp(user, form.cleaned_data["code"])
        if codes is not None:
            messages.success(request, "Two-step sign-in is on.")
            return render(request, "dashboard/security.html", {"enrolled": True, "recovery_codes": codes})
        form.add_error("code", "That code is not right; check the clock of your phone and try the next one.")
    secret = base64.b32encode(device.bin_key).decode().rstrip("=")
    context = {"form": form, "qr": _qr_data_uri(device.config_url), "secret": secret, "enrolled": False}
    return render(request, "dashboard/security.html", context)


@login_required
@require_POST
def security_disable(request: HttpRequest) -> HttpResponse:
    tenant = current_tenant(request)

    accounts.remove_second_factor(request.user)
    if tenant is not None and owner_needs_totp(request, tenant):
        messages.warning(request, "Your plan requires a second factor for owners; set up a new one now.")
    else:
        messages.success(request, "Two-step sign-in is off.")
    return redirect("dashboard:security")
