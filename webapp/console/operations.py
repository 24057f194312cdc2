"""The admin console's Operations page: live worker, queue and job figures, 24-hour charts, Recycle workers.

The page loads once and then refreshes its body every few seconds through a
static script (the CSP allows no inline script) that fetches ``data.json``;
that answer carries the figures and the same body rendered as HTML. All of it
comes from heartbeats, Redis and rows (``operations.collect``), never from a worker.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import redis
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from webapp.admin_site import site
from webapp.audit.services import record
from webapp.console import charts
from webapp.console.workers import can_view, worker_row
from webapp.housekeeping.models import OperationsSnapshot
from webapp.humane import duration
from webapp.speech import operations
from webapp.speech.runtime import rolling

log = logging.getLogger(__name__)

# Seconds between the page's refreshes (the script reads it from the page).
REFRESH_SECONDS = 5
RECYCLE_PERMISSION = "speech.change_synthesisjob"
# (title, unit, [(series label, snapshot key)])
CHARTS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Worker children", "", [("ready", "ready"), ("live", "children")]),
    ("Waiting", "jobs", [("queued jobs", "queued_jobs"), ("broker messages", "queue_depth")]),
    ("Queue wait (last hour)", "s", [("p50", "queue_wait_p50"), ("p95", "queue_wait_p95")]),
    ("RTF (last hour)", "", [("p50", "rtf_p50"), ("p95", "rtf_p95")]),
    (
        "Worker memory",
        "MiB",
        [
            ("RSS, all children", "rss_mb_total"),
            ("RSS, largest child", "rss_mb_max"),
            ("GPU", "gpu_mb_total"),
        ],
    ),
    ("Recycles (last hour)", "", [("recycles", "recycles_hour")]),
]


def can_recycle(request: HttpRequest) -> bool:
    return can_view(request) and bool(request.user.has_perm(RECYCLE_PERMISSION))


def chart_html(now: float) -> list[Any]:
    since = timezone.now() - dt.timedelta(seconds=operations.DAY)
    keys = sorted({key for _, _, series in CHARTS for _, key in series})
    rows = OperationsSnapshot.objects.filter(at__gte=since).order_by("at")
    values = list(rows.values_list("at", *(f"data__{k}" for k in keys)))
    out = []
    for title, unit, series in CHARTS:
        lines = []
        for label, key in series:
            i = keys.index(key) + 1
            points = [(r[0].timestamp(), float(r[i])) for r in values if isinstance(r[i], int | float)]
            lines.append((label, points))
        out.append(charts.line_chart(title, lines, now - operations.DAY, now, unit))
    return out


def _plan_status(beats: list[dict[str, Any]]) -> dict[str, Any] | None:
    plan = rolling.read_plan()
    if plan is None:
        return None
    state = rolling.progress(plan, beats)
    return {
        "id": plan.get("id", ""),
        "by": plan.get("requested_by", ""),
        "scope": plan.get("scope") or "all nodes",
        "total": state.total,
        "replaced": state.replaced,
        "done": state.done,
        "waiting_for": state.waiting_for,
        "age": duration(max(0.0, time.time() - float(plan.get("requested_at") or time.time()))),
    }


def page_data(now: float | None = None) -> dict[str, Any]:
    """Everything the body shows; raises redis errors for the caller to report."""
    now = time.time() if now is None else now
    figures = operations.collect(now)
    beats = figures["beats"]
    rows = []
    for beat in sorted(beats, key=lambda b: (str(b.get("host")), str(b.get("node")), str(b.get("pid")))):
        rows.append({**worker_row(beat, now), "closest_recycle": operations.closest_recycle(beat, now)})
    recycles = [
        {**r, "age": duration(max(0.0, now - float(r["at"]))) + " ago", "pid": str(r.get("pid", ""))}
        for r in figures["recycles"]
    ]
    by_kind: dict[str, int] = {}
    for r in recycles:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
    return {
        "workers": rows,
        "nodes": sorted({r["node"] for r in rows if r["node"]}),
        "queues": sorted(figures["queues"].items()),
        "queued_jobs": sorted(figures["queued_jobs"].items()),
        "jobs": figures["jobs"],
        "recycles": recycles,
        "recycles_by_kind": sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])),
        "plan": _plan_status(beats),
        # An engine a live child is meant to serve but could not load (its package, its model
        # directory, its memory): the child serves the rest and backs off none (docs/engines.md).
        "unavailable_engines": sorted(operations.unavailable_engines(beats).items()),
        # Remote models' upstream replicas (docs/engines.md, "Remote engines").
        "upstreams": operations.upstreams(beats),
    }


def _context(request: HttpRequest) -> dict[str, Any]:
    context: dict[str, Any] = {"redis_error": "", "can_recycle": can_recycle(request)}
    try:
        context.update(page_data())
    except (redis.RedisError, OSError) as exc:
        log.warning("admin operations page: cannot read Redis: %s", exc)
        context["redis_error"] = type(exc).__name__
    context["charts"] = chart_html(time.time())
    context["now"] = timezone.now()
    return context


@never_cache
def operations_view(request: HttpRequest) -> TemplateResponse:
    if not can_view(request):
        raise PermissionDenied
    request.current_app = site.name
    context = {**site.each_context(request), "title": "Operations", "refresh_seconds": REFRESH_SECONDS}
    context.update(_context(request))
    return TemplateResponse(request, "admin/speech/operations.html", context)


@never_cache
def operations_data(request: HttpRequest) -> JsonResponse:
    """The live refresh: the figures as JSON and the page body rendered with them."""
    if not can_view(request):
        raise PermissionDenied
    context = _context(request)
    body = render_to_string("admin/speech/_operations_body.html", context, request=request)
    keys = ("workers", "queues", "queued_jobs", "jobs", "recycles", "plan", "upstreams", "redis_error")
    data = {k: context.get(k) for k in keys}
    return JsonResponse({"at": time.time(), **data, "html": body}, json_dumps_params={"default": str})


@never_cache
@require_POST
def recycle_workers(request: HttpRequest) -> HttpResponse:
    """Start a rolling recycle of all nodes' children or one node's; refused with the reason when unsafe."""
    if not can_recycle(request):
        raise PermissionDenied
    node = request.POST.get("node") or None
    scope = node or "all nodes"
    try:
        plan = rolling.start(node, requested_by=str(request.user.get_username()))
    except rolling.Refused as exc:
        record("workers.recycle_refused", target=f"workers on {scope}", details={"reason": str(exc)})
        messages.error(request, f"Recycle workers refused: {exc}")
    except (redis.RedisError, OSError) as exc:
        messages.error(request, f"Recycle workers failed: Redis is unreachable ({type(exc).__name__}).")
    else:
        record(
            "workers.recycle",
            target=f"workers on {scope}",
            details={"plan": plan["id"], "children": plan["order"], "nodes": plan["nodes"]},
        )
        messages.success(
            request, f"Rolling recycle {plan['id']} started: {len(plan['order'])} children, one at a time."
        )
    return redirect("admin:speech_operations")
