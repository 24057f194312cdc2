"""API keys and members of the current organisation."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard import accounts
from webapp.dashboard.access import MANAGERS, Tenant, error_text, tenant_page
from webapp.dashboard.forms import InviteForm, KeyForm, RoleForm
from webapp.errors import DomainError
from webapp.problems import Problem
from webapp.tenants import accounts as people
from webapp.tenants.models import ApiKey, Membership
from webapp.tenants.services import create_api_key, revoke_api_key

SERVICE_ERRORS = (DomainError, Problem)


def _keys_context(tenant: Tenant, form: KeyForm) -> dict[str, object]:
    keys = ApiKey.objects.filter(organization=tenant.organization).order_by("revoked_at", "-created_at")
    return {"tenant": tenant, "form": form, "keys": keys}


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
            )
        except SERVICE_ERRORS as exc:
            form.add_error(None, error_text(exc))
        else:
            base = request.build_absolute_uri("/").rstrip("/")
            context = {**_keys_context(tenant, KeyForm()), "new_key": key, "raw_key": raw, "base": base}
            context["default_voice"] = settings.TTS_DEFAULT_VOICE
            response = render(request, "dashboard/keys.html", context)
            response["Cache-Control"] = "no-store"
            return response
    return render(request, "dashboard/keys.html", _keys_context(tenant, form))


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


@tenant_page()
@require_http_methods(["GET", "POST"])
def members(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = InviteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            membership, created = people.invite_member(
                tenant.organization, form.cleaned_data["email"], form.cleaned_data["role"], by=request.user
            )
        except SERVICE_ERRORS as exc:
            form.add_error(None, error_text(exc))
        else:
            if created:
                accounts.send_invitation(request, membership.user, tenant.organization, request.user)
            messages.success(request, f"{membership.user.email} is now a {membership.role}.")
            return redirect("dashboard:members")
    rows = Membership.objects.filter(organization=tenant.organization).select_related("user")
    context = {"tenant": tenant, "form": form, "rows": rows.order_by("created_at"), "role_form": RoleForm()}
    return render(request, "dashboard/members.html", context)


def _membership(tenant: Tenant, pk: int) -> Membership:
    membership = (
        Membership.objects.filter(organization=tenant.organization, pk=pk).select_related("user").first()
    )
    if membership is None:
        raise Http404("No such member.")
    return membership


@tenant_page(roles=MANAGERS)
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


@tenant_page(roles=MANAGERS)
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
