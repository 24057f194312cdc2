"""The Webhooks page: a tenant's endpoints, their signing secrets, pings, and the delivery log.

Every change goes through ``webapp.webhooks.services``, the functions behind
``/api/v1/webhooks``; the API asks for ``keys:manage``, which only owners and
admins can use, so only they see these pages. A secret is shown once, in the
answer to the create or rotate POST (``Cache-Control: no-store``), and never again.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.dashboard.access import MANAGERS, Tenant, error_text, tenant_page
from webapp.dashboard.forms import WebhookForm, WebhookRotateForm
from webapp.errors import DomainError
from webapp.problems import Problem
from webapp.webhooks import services
from webapp.webhooks.models import WebhookAttempt, WebhookEndpoint, WebhookMessage

SERVICE_ERRORS = (DomainError, Problem)
LOG_ROWS = 50


def _endpoint(tenant: Tenant, pk: uuid.UUID) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(organization=tenant.organization, pk=pk).first()
    if endpoint is None:
        raise Http404("No such webhook endpoint.")
    return endpoint


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response


def _list_page(
    request: HttpRequest,
    tenant: Tenant,
    form: WebhookForm,
    status: int = 200,
    new: WebhookEndpoint | None = None,
) -> HttpResponse:
    endpoints = WebhookEndpoint.objects.filter(organization=tenant.organization).order_by(
        "-created_at", "-id"
    )
    context = {
        "tenant": tenant,
        "form": form,
        "endpoints": endpoints,
        "new_endpoint": new,
        "max_endpoints": services.MAX_ENDPOINTS,
    }
    return render(request, "dashboard/webhooks.html", context, status=status)


@tenant_page(roles=MANAGERS, verified=True)
@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    if request.method != "POST":
        return _list_page(request, tenant, WebhookForm())
    form = WebhookForm(request.POST)
    if not form.is_valid():
        return _list_page(request, tenant, form, status=400)
    data = form.cleaned_data
    try:
        endpoint = services.create_endpoint(
            tenant.organization,
            data["url"],
            data["events"],
            description=data["description"].strip(),
            enabled=data["enabled"],
        )
    except SERVICE_ERRORS as exc:
        form.add_error(None, error_text(exc))
        return _list_page(request, tenant, form, status=Problem.of(exc).status)
    return _no_store(_list_page(request, tenant, WebhookForm(), new=endpoint))


def _detail_page(
    request: HttpRequest,
    tenant: Tenant,
    endpoint: WebhookEndpoint,
    form: WebhookForm | None = None,
    status: int = 200,
    rotated: bool = False,
) -> HttpResponse:
    attempts = Prefetch("attempt_log", queryset=WebhookAttempt.objects.order_by("started_at", "id"))
    log = list(
        WebhookMessage.objects.filter(endpoint=endpoint)
        .prefetch_related(attempts)
        .order_by("-created_at", "-id")[:LOG_ROWS]
    )
    rows = []
    for message in log:
        tried = list(message.attempt_log.all())
        rows.append({"message": message, "attempts": tried, "last": tried[-1] if tried else None})
    if form is None:
        form = WebhookForm(
            initial={
                "url": endpoint.url,
                "events": endpoint.events,
                "description": endpoint.description,
                "enabled": endpoint.enabled,
            },
            auto_id="edit_%s",
        )
    context = {
        "tenant": tenant,
        "endpoint": endpoint,
        "form": form,
        "rotate_form": WebhookRotateForm(),
        "log": rows,
        "log_rows": LOG_ROWS,
        "rotated": rotated,
    }
    return render(request, "dashboard/webhook.html", context, status=status)


@tenant_page(roles=MANAGERS, verified=True)
@require_GET
def webhook(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    return _detail_page(request, tenant, _endpoint(tenant, pk))


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def webhook_edit(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    endpoint = _endpoint(tenant, pk)
    form = WebhookForm(request.POST, auto_id="edit_%s")
    if not form.is_valid():
        return _detail_page(request, tenant, endpoint, form, status=400)
    data = form.cleaned_data
    changes = {**data, "description": data["description"].strip()}
    services.update_endpoint(endpoint, changes)
    messages.success(request, "The endpoint is saved.")
    return redirect("dashboard:webhook", pk=endpoint.pk)


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def webhook_rotate(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    endpoint = _endpoint(tenant, pk)
    form = WebhookRotateForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose how long the old secret keeps signing.")
        return redirect("dashboard:webhook", pk=endpoint.pk)
    rotated = services.rotate_secret(endpoint, form.cleaned_data["overlap"])
    return _no_store(_detail_page(request, tenant, rotated, rotated=True))


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def webhook_ping(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    endpoint = _endpoint(tenant, pk)
    try:
        services.ping(endpoint, "A test event sent from the dashboard.")
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, "A ping is on its way; its delivery is at the top of the log below.")
    return redirect("dashboard:webhook", pk=endpoint.pk)


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def webhook_delete(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    endpoint = _endpoint(tenant, pk)
    services.delete_endpoint(endpoint)
    messages.success(request, f"The endpoint {endpoint.url} and its delivery log are deleted.")
    return redirect("dashboard:webhooks")


@tenant_page(roles=MANAGERS, verified=True)
@require_POST
def delivery_redeliver(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    message = (
        WebhookMessage.objects.filter(organization=tenant.organization, pk=pk, endpoint__isnull=False)
        .select_related("endpoint")
        .first()
    )
    if message is None or message.endpoint is None:
        raise Http404("No such delivery.")
    try:
        services.redeliver(message)
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"The {message.event} delivery is sent again (same webhook-id).")
    return redirect("dashboard:webhook", pk=message.endpoint.pk)
