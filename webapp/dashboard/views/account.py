"""The signed-in person's own settings: e-mail, organisation, second factor.

Changing the e-mail and turning two-step sign-in on or off ask for the
password again (and a current code while two-step sign-in is on), so a
session alone, left open or stolen, cannot take the account over; each
change ends the account's other sessions.
"""

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
from webapp.dashboard.forms import EmailChangeForm, EnrolForm, ReauthForm


def _account_page(request: HttpRequest, form: EmailChangeForm, status: int = 200) -> HttpResponse:
    context = {
        "form": form,
        "tenant": current_tenant(request),
        "unverified": accounts.needs_verification(request.user),
        "has_totp": accounts.confirmed_totp(request.user) is not None,
    }
    return render(request, "dashboard/account.html", context, status=status)


def _reauthenticated(request: HttpRequest, form: ReauthForm) -> bool:
    wrong = accounts.reauthenticate(request, form.cleaned_data["password"], form.cleaned_data.get("code", ""))
    if wrong is not None:
        form.add_error(*wrong)
    return wrong is None


@login_required
@require_http_methods(["GET", "POST"])
def account(request: HttpRequest) -> HttpResponse:
    has_totp = accounts.confirmed_totp(request.user) is not None
    form = EmailChangeForm(request.POST or None, with_code=has_totp)
    if request.method == "POST" and form.is_valid() and _reauthenticated(request, form):
        email = form.cleaned_data["email"].strip().lower()
        if not accounts.mail_allowed(request, email):
            form.add_error(None, accounts.MAIL_REFUSED)
            return _account_page(request, form, status=429)
        # The same answer whether or not the address is taken: a taken one gets a notice, not a link.
        accounts.start_email_change(request, request.user, email)
        messages.success(
            request, f"We sent a message to {email}; your address changes once you follow its link."
        )
        return redirect("dashboard:account")
    return _account_page(request, form, status=400 if form.errors else 200)


@login_required
@require_POST
def resend_verification(request: HttpRequest) -> HttpResponse:
    user: Any = request.user
    if accounts.needs_verification(user):
        if not accounts.mail_allowed(request, user.email):
            messages.error(request, accounts.MAIL_REFUSED)
            form = EmailChangeForm(with_code=accounts.confirmed_totp(user) is not None)
            return _account_page(request, form, status=429)
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


def _enrolled_page(request: HttpRequest, form: ReauthForm | None = None, **context: Any) -> HttpResponse:
    form = form or ReauthForm(with_code=True)
    status = 400 if form.errors else 200
    return render(
        request, "dashboard/security.html", {"enrolled": True, "form": form, **context}, status=status
    )


@login_required
@require_http_methods(["GET", "POST"])
def security(request: HttpRequest) -> HttpResponse:
    """Enrol a TOTP app: a QR code and the secret, confirmed by one code and the password; recovery
    codes shown once. The password keeps a session alone from adding a device (a staff user's
    first one would let it into the admin)."""
    user = request.user
    if accounts.confirmed_totp(user) is not None:
        return _enrolled_page(request)
    device = accounts.pending_totp(user)
    form = EnrolForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        wrong = accounts.reauthenticate(request, form.cleaned_data["password"])
        codes = None if wrong else accounts.confirm_totp(user, form.cleaned_data["code"])
        if wrong:
            form.add_error(*wrong)
        elif codes is not None:
            accounts.end_other_sessions(request, user)
            messages.success(request, "Two-step sign-in is on; your other sessions were signed out.")
            return _enrolled_page(request, recovery_codes=codes)
        else:
            form.add_error(
                "code", "That code is not right; check the clock of your phone and try the next one."
            )
    secret = base64.b32encode(device.bin_key).decode().rstrip("=")
    context = {"form": form, "qr": _qr_data_uri(device.config_url), "secret": secret, "enrolled": False}
    return render(request, "dashboard/security.html", context, status=400 if form.errors else 200)


@login_required
@require_POST
def security_disable(request: HttpRequest) -> HttpResponse:
    if accounts.confirmed_totp(request.user) is None:
        return redirect("dashboard:security")
    form = ReauthForm(request.POST, with_code=True)
    if not (form.is_valid() and _reauthenticated(request, form)):
        return _enrolled_page(request, form)
    accounts.remove_second_factor(request.user)
    accounts.end_other_sessions(request, request.user)
    tenant = current_tenant(request)
    if tenant is not None and owner_needs_totp(request, tenant):
        messages.warning(request, "Your plan requires a second factor for owners; set up a new one now.")
    else:
        messages.success(request, "Two-step sign-in is off; your other sessions were signed out.")
    return redirect("dashboard:security")
