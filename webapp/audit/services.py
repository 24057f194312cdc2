"""Writing the audit log: explicit events from the services, and every other admin write.

Services call :func:`record` for what they do (keys created or revoked,
jobs retried, tenants deleted); the request context supplies who and from
where. Any other successful write through the admin (a form saved, an action
run: Django's admin answers those with a redirect) is recorded by the request
middleware as ``admin.<view>`` unless the request already recorded an event.
"""

from __future__ import annotations

import logging
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

from webapp.audit import context
from webapp.audit.models import AuditEvent

log = logging.getLogger(__name__)


def _request_user(ctx: context.RequestContext | None) -> Any:
    user = getattr(getattr(ctx, "request", None), "user", None)
    return user if getattr(user, "is_authenticated", False) else None


def _actor(actor: Any, ctx: context.RequestContext | None) -> tuple[Any, str]:
    """(user or None, label) of whoever acts: a user, an API key, or the operator (the signed-in staff user)."""
    # By the app registry: tenants sit above audit (they record their events here).
    if isinstance(actor, apps.get_model("tenants", "ApiKey")):
        return actor.user, f"api key tts_{actor.prefix}_…"
    if getattr(actor, "is_authenticated", False):
        return actor, str(actor.get_username())
    user = _request_user(ctx)
    if user is not None:
        return user, str(user.get_username())
    return None, "operator (manage.py)" if actor is not None else "system"


def _target(target: Any) -> dict[str, str]:
    if target is None:
        return {}
    if isinstance(target, models.Model):
        return {
            "target_type": target._meta.label_lower,
            "target_id": str(target.pk)[:100],
            "target": str(target)[:300],
        }
    return {"target": str(target)[:300]}


def record(
    action: str,
    *,
    target: Any = None,
    organization: Any = None,
    actor: Any = None,
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Record one event. ``actor``: a user, an ApiKey or OPERATOR; by default the request's user."""
    ctx = context.current()
    user, label = _actor(actor, ctx)
    org_id = getattr(organization, "pk", organization)
    event = AuditEvent.objects.create(
        actor=user,
        actor_label=label[:200],
        action=action[:100],
        organization_id=org_id,
        ip=ctx.ip if ctx else None,
        request_id=ctx.request_id if ctx else "",
        details=details or {},
        **_target(target),
    )
    if ctx is not None:
        ctx.audited += 1
    return event


def _admin_prefix() -> str:
    return "/" + str(getattr(settings, "TTS_ADMIN_URL_PREFIX", "admin/")).strip("/") + "/"


def record_admin_write(request: HttpRequest, response: HttpResponse) -> None:
    """After an admin POST that succeeded (a redirect) and recorded nothing itself: one generic event."""
    ctx = context.current()
    if request.method != "POST" or not request.path.startswith(_admin_prefix()):
        return
    if not 300 <= response.status_code < 400 or ctx is None or ctx.audited:
        return
    if _request_user(ctx) is None:
        return  # a failed login: django-axes counts those
    try:
        match = resolve(request.path)
    except Resolver404:
        return
    details: dict[str, Any] = {"path": request.path}
    if request.POST.get("action"):
        details["admin_action"] = request.POST["action"]
        details["selected"] = request.POST.getlist("_selected_action")[:100]
    object_id = match.kwargs.get("object_id", "")
    try:
        record(
            f"admin.{match.url_name}",
            target=f"{match.url_name} {object_id}".strip(),
            details={**details, "object_id": str(object_id)} if object_id else details,
        )
    except Exception:  # the write itself is done; a lost audit line is logged, not raised
        log.exception("could not record the admin write %s", request.path)


def anonymise_tenant(organization_id: Any) -> int:
    """A deleted tenant's events keep what happened, not whose it was. Returns events changed."""
    named = str(organization_id)
    about = Q(organization_id=organization_id) | Q(target_id=named) | Q(target__contains=named)
    return AuditEvent.objects.filter(about).update(
        organization_id=None, target="(deleted tenant)", target_id="", details={}
    )
