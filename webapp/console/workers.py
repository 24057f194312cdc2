"""The admin console's read-only "Workers" page: every live worker child, from its heartbeat.

Everything shown comes from Redis (``heartbeat.live_workers`` and the per-node
records of ``recycling``), never from the workers themselves, so the page works
for children on any host. Heartbeats are data written by other processes: every
value is coerced to a display string here and escaped by the template.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import redis
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache

from webapp import redis_clients
from webapp.admin_site import site
from webapp.humane import duration
from webapp.speech import heartbeat
from webapp.speech.runtime import recycling

log = logging.getLogger(__name__)

# Who may see the page besides superusers: whoever may look at synthesis jobs.
PERMISSION = "speech.view_synthesisjob"
# Recycle events shown per node: enough to see a pattern, short enough to read.
RECENT_RECYCLES = 5


def can_view(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(PERMISSION))


# ----------------------------------------------------------------------------- formatting


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _age(at: Any, now: float) -> str:
    value = _num(at)
    # max(0, …): another host's clock a little ahead is "0.0 s ago", not nothing.
    return "-" if value is None else duration(max(0.0, now - value)) + " ago"


def _until(at: Any, now: float) -> str:
    value = _num(at)
    if value is None:
        return ""
    return "in " + duration(value - now) if value > now else "due"


def _timestamp(at: Any) -> str:
    value = _num(at)
    if value is None:
        return ""
    try:
        return datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return ""


def _mb(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:,.1f}"


def _text_list(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)] if value else []


def _reason_counts(value: Any) -> list[tuple[str, int]]:
    if not isinstance(value, dict):
        return []
    counts = []
    for kind, count in value.items():
        number = _num(count)
        if number is not None:
            counts.append((str(kind), int(number)))
    return sorted(counts, key=lambda kc: (-kc[1], kc[0]))


def _rtf(value: Any) -> list[dict[str, str]]:
    """Per engine: the rolling median and the child's baseline."""
    if not isinstance(value, dict):
        return []
    out = []
    for engine, figures in sorted(value.items()):
        figures = figures if isinstance(figures, dict) else {}
        rolling, baseline = _num(figures.get("rolling")), _num(figures.get("baseline"))
        out.append(
            {
                "engine": str(engine),
                "rolling": "-" if rolling is None else f"{rolling:.3f}",
                "baseline": "-" if baseline is None else f"{baseline:.3f}",
            }
        )
    return out


def worker_row(beat: dict[str, Any], now: float) -> dict[str, Any]:
    """One heartbeat as the strings a table row shows."""
    state = str(beat.get("state") or "unknown")
    next_retry = _num(beat.get("next_retry_at"))
    tasks = _num(beat.get("tasks_done"))
    max_tasks = _num(beat.get("max_tasks_per_child"))
    voices = beat.get("voices")
    return {
        "worker_id": str(beat.get("worker_id", "")),
        "node": str(beat.get("node", "")),
        "host": str(beat.get("host", "")),
        "pid": str(beat.get("pid", "")),
        "state": state,
        "healthy": state == "ready",
        "next_retry": _until(next_retry, now),
        "next_retry_at": _timestamp(next_retry),
        "load_failures": str(beat.get("load_failures", "")),
        "load_attempts": str(beat.get("load_attempts", "")),
        "error": str(beat.get("error") or ""),
        "device": str(beat.get("device") or "-"),
        "engines": ", ".join(_text_list(beat.get("engines"))) or "-",
        "voices": len(voices) if isinstance(voices, list) else 0,
        "loaded_age": _age(beat.get("loaded_at"), now),
        "loaded_at": _timestamp(beat.get("loaded_at")),
        "tasks_done": "-" if tasks is None else str(int(tasks)),
        "max_tasks": "" if not max_tasks else str(int(max_tasks)),
        "current_job": str(beat.get("current_job") or ""),
        "recycles": str(beat.get("recycles", 0)),
        "last_recycle_reason": str(beat.get("last_recycle_reason") or ""),
        "recycle_reason": str(beat.get("recycle_reason") or ""),
        "recycle_in": _until(beat.get("recycle_at"), now),
        "recycle_at": _timestamp(beat.get("recycle_at")),
        "held_back": str(beat.get("recycle_held_back") or ""),
        "rss_mb": _mb(beat.get("rss_mb")),
        "gpu_mb": _mb(beat.get("gpu_mb")),
        "baseline_rss_mb": _mb(beat.get("baseline_rss_mb")),
        "baseline_gpu_mb": _mb(beat.get("baseline_gpu_mb")),
        "rtf": _rtf(beat.get("rtf")),
        "beat_age": _age(beat.get("at"), now),
        "beat_at": _timestamp(beat.get("at")),
    }


def node_summary(client: redis.Redis, node: str, now: float) -> dict[str, Any]:
    """A node's recycle counts by reason and its last recycle events, from Redis."""
    stats = recycling.node_stats(client, node)
    recent: list[dict[str, str]] = []
    try:
        events = recycling.node_events(client, node)
    except ValueError:  # one corrupt entry must not hide the page
        events = []
    for event in reversed(events):
        if isinstance(event, dict) and event.get("event") == "recycle":
            recent.append(
                {
                    "age": _age(event.get("at"), now),
                    "at": _timestamp(event.get("at")),
                    "pid": str(event.get("pid", "")),
                    "tasks": str(event.get("tasks", "")),
                    "reason": str(event.get("reason", "")),
                }
            )
            if len(recent) >= RECENT_RECYCLES:
                break
    return {
        "node": node,
        "recycles": stats["recycles"],
        "reasons": _reason_counts(stats["recycle_reasons"]),
        "load_failures": stats["load_failures"],
        "recent": recent,
    }


def collect(now: float | None = None) -> dict[str, Any]:
    """The page's data; raises redis errors for the caller to report."""
    now = time.time() if now is None else now
    client = redis_clients.heartbeats()
    beats = [b for b in heartbeat.live_workers() if isinstance(b, dict)]
    rows = sorted(
        (worker_row(b, now) for b in beats), key=lambda r: (r["host"], r["node"], r["pid"].zfill(12))
    )
    nodes = sorted({r["node"] for r in rows if r["node"]})
    summaries = []
    for node in nodes:
        summary = node_summary(client, node, now)
        summary["children"] = sum(1 for r in rows if r["node"] == node)
        summary["ready"] = sum(1 for r in rows if r["node"] == node and r["healthy"])
        summaries.append(summary)
    return {"workers": rows, "nodes": summaries, "ready_count": sum(1 for r in rows if r["healthy"])}


# ----------------------------------------------------------------------------- the view


@never_cache
def workers_view(request: HttpRequest) -> TemplateResponse:
    """Served through ``site.add_page`` (admin_view): anyone not staff is sent to the login page first."""
    if not can_view(request):
        raise PermissionDenied
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Workers",
        "now": _timestamp(time.time()),
        "redis_error": "",
        "workers": [],
        "nodes": [],
    }
    try:
        context.update(collect())
    except (redis.RedisError, OSError) as exc:
        # The page exists to diagnose trouble; Redis being down is trouble to show, not a 500.
        log.warning("admin workers page: cannot read heartbeats: %s", exc)
        context["redis_error"] = type(exc).__name__
    request.current_app = site.name
    return TemplateResponse(request, "admin/speech/workers.html", context)
