"""API keys and members of the current organisation."""

from __future__ import annotations

import datetime as dt
import uuid

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard import accounts
from webapp.dashboard.access import MANAGERS, Tenant, error_text, tenant_page
from webapp.dashboard.forms import InviteForm, KeyForm, RoleForm, RotateForm
from webapp.errors import DomainError, ErrorCode
from webapp.problems import Problem
from webapp.speech.services import ledger
from webapp.tenants import accounts as people
from webapp.tenants.models import KEY_EXPIRY_WARNING_DAYS, ApiKey, Invitation, Membership
from webapp.tenants.services import create_api_key, revoke_api_key, rotate_api_key

SERVICE_ERRORS = (DomainError, Problem)


def _keys_context(request: HttpRequest, tenant: Tenant, form: KeyForm) -> dict[str, object]:
    keys = list(ApiKey.objects.filter(organization=tenant.organization).order_by("revoked_at", "-created_at"))
    now = timezone.now()
    used = ledger.key_characters(tenant.organization.pk, ledger.period_start(now))
    soon = now + dt.timedelta(days=KEY_EXPIRY_WARNING_DAYS)
    rows = [
        {
            "key": key,
            "used": used.get(key.pk, 0),
            "expires_soon": key.is_usable(now) and key.expires_at is not None and key.expires_at <= soon,
            "overlap_open": key.previous_valid_until is not None and key.previous_valid_until > now,
            # Who rotates sees the new secret: the key's holder, or an owner (services.rotate_api_key).
            "can_rotate": key.user_id == request.user.pk or tenant.role == Membership.Role.OWNER,
        }
        for key in keys
    ]
    expiring = [row["key"] for row in rows if row["expires_soon"]]
    return {
        "tenant": tenant,
        "form": form,
        "keys": rows,
        "expiring": expiring,
        "rotate_form": RotateForm(),
        "warning_days": KEY_EXPIRY_WARNING_DAYS,
    }


@tenant_page(roles=MANAGERS, verified=True)
@require_http_methods(["GET", "POST"])
def keys(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """List and create. A new key is shown once, in the answer to the POST, and never again."""
    form = KeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key, raw = create_api_key(
                tenant.organization,
                form.cleaned_data["name"],
                scopes=list(form.cleaned_data["scopes"]),
                created_by=request.user,
                expires_at=form.expires_at(),
                monthly_characters=form.cleaned_data.get("monthly_characters"),
            )
        except SERVICE_ERRORS as exc:
            form.add_error(None, error_text(exc))
        else:
            base = request.build_absolute_uri("/").rstrip("/")
            context = {
                **_keys_context(request, tenant, KeyForm()),
                "new_key": key,
                "raw_key": raw,
                "base": base,
            }
            context["default_voice"] = settings.TTS_DEFAULT_VOICE
            response = render(request, "dashboard/keys.html", context)
            response["Cache-Control"] = "no-store"
            return response
    return render(request, "dashboard/keys.html", _keys_context(request, tenant, form))


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def revoke_key(request: HttpRequest, tenant: Tenant, key_id: str) -> HttpResponse:
    key = ApiKey.objects.filter(organization=tenant.organization, pk=key_id).first()
    if key is None:
        raise Http404("No such key.")
    try:
        revoke_api_key(key, by=request.user)
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"Key {key.name} (tts_{key.prefix}_…) is revoked.")
    return redirect("dashboard:keys")


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def rotate_key(request: HttpRequest, tenant: Tenant, key_id: str) -> HttpResponse:
    """A new secret for the key, shown once; the old one works for the overlap chosen."""
    key = (
        ApiKey.objects.filter(organization=tenant.organization, pk=key_id)
        .select_related("organization")
        .first()
    )
    if key is None:
        raise Http404("No such key.")
    form = RotateForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose how long the old secret keeps working.")
        return redirect("dashboard:keys")
    try:
        raw = rotate_api_key(key, by=request.user, overlap=dt.timedelta(seconds=form.cleaned_data["overlap"]))
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
        return redirect("dashboard:keys")
    base = request.build_absolute_uri("/").rstrip("/")
    context = {
        **_keys_context(request, tenant, KeyForm()),
        "new_key": key,
        "raw_key": raw,
        "base": base,
        "rotated": True,
    }
    context["default_voice"] = settings.TTS_DEFAULT_VOICE
    response = render(request, "dashboard/keys.html", context)
    response["Cache-Control"] = "no-store"
    return response


def _members_page(request: HttpRequest, tenant: Tenant, form: InviteForm, status: int = 200) -> HttpResponse:
    rows = Membership.objects.filter(organization=tenant.organization).select_related("user")
    invitations = Invitation.objects.filter(organization=tenant.organization).order_by("created_at")
    context = {
        "tenant": tenant,
        "form": form,
        "rows": rows.order_by("created_at"),
        "invitations": invitations if tenant.can_manage else [],
        "now": timezone.now(),
        "role_form": RoleForm(),
    }
    return render(request, "dashboard/members.html", context, status=status)


@tenant_page()
@require_http_methods(["GET", "POST"])
def members(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """Members, pending invitations, and the invitation form.

    Inviting needs a manager whose own address is confirmed, counts against
    the inviter's, the tenant's and the address's hourly budgets, and answers
    the same whether or not the address has an account (no account is made
    or looked up: an invitation is a pending row until its link is followed).
    """
    form = InviteForm(request.POST or None)
    if request.method != "POST":
        return _members_page(request, tenant, form)
    if not tenant.can_manage:
        return render(request, "dashboard/forbidden.html", {"tenant": tenant}, status=403)
    if accounts.needs_verification(request.user):
        form.add_error(None, "Confirm your own e-mail address before you invite anyone.")
        return _members_page(request, tenant, form, status=403)
    if not form.is_valid():
        return _members_page(request, tenant, form, status=400)
    email = form.cleaned_data["email"].strip().lower()
    if not accounts.mail_allowed(request, email):
        form.add_error(None, accounts.MAIL_REFUSED)
        return _members_page(request, tenant, form, status=429)
    try:
        invitation, raw = people.invite_member(
            tenant.organization, email, form.cleaned_data["role"], by=request.user
        )
    except SERVICE_ERRORS as exc:
        form.add_error(None, error_text(exc))
        limited = isinstance(exc, DomainError) and exc.code == ErrorCode.RATE_LIMITED
        return _members_page(request, tenant, form, status=429 if limited else 400)
    accounts.send_invitation(request, invitation, raw)
    messages.success(request, f"We sent an invitation to {email}; they join once they follow its link.")
    return redirect("dashboard:members")


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def invitation_withdraw(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    invitation = Invitation.objects.filter(organization=tenant.organization, pk=pk).first()
    if invitation is None:
        raise Http404("No such invitation.")
    try:
        people.withdraw_invitation(invitation, by=request.user)
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(
            request, f"The invitation of {invitation.email} is withdrawn; its link no longer works."
        )
    return redirect("dashboard:members")


def _membership(tenant: Tenant, pk: int) -> Membership:
    membership = (
        Membership.objects.filter(organization=tenant.organization, pk=pk).select_related("user").first()
    )
    if membership is None:
        raise Http404("No such member.")
    return membership


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def member_role(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    membership = _membership(tenant, pk)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles.")
        return redirect("dashboard:members")
    try:
        people.change_role(membership, form.cleaned_data["role"], by=request.user)
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{membership.user.email} is now a {membership.role}.")
    return redirect("dashboard:members")


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def member_remove(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    membership = _membership(tenant, pk)
    try:
        people.remove_member(membership, by=request.user)
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{membership.user.email} was removed.")
    return redirect("dashboard:members")
