"""The operations page's figures, from heartbeats, Redis and rows only: never from a worker.

:func:`collect` gathers what the page shows now; :func:`snapshot` is the
compact part of it the ``snapshot_operations`` housekeeping job stores every
minute (``OperationsSnapshot``), which the page's 24-hour charts and
``/metrics`` read back.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django.conf import settings
from django.db.models import Aggregate, Count, FloatField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from webapp import redis_clients
from webapp.speech import heartbeat
from webapp.speech.models import SynthesisJob
from webapp.speech.runtime import recycling
from webapp.speech.services import upstream_voices

HOUR = 3600.0
DAY = 24 * HOUR
# Kombu's Redis transport keeps one list per priority step: "<queue>" and "<queue>\x06\x16<n>".
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
FIXED_QUEUES = ("default", "housekeeping", "analysis")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def queue_names(beats: list[dict[str, Any]]) -> list[str]:
    """Every queue a job can wait in: the fixed ones and one per engine known here or to a worker."""
    engines = set(settings.TTS_WORKER_ENGINES)
    for beat in beats:
        if isinstance(beat.get("engines"), list):
            engines.update(str(e) for e in beat["engines"])
    return [*FIXED_QUEUES, *(f"synth.{e}" for e in sorted(engines))]


def unavailable_engines(beats: list[dict[str, Any]]) -> dict[str, str]:
    """Engine -> why, for each engine a live child names in its heartbeat as unavailable."""
    out: dict[str, str] = {}
    for beat in beats:
        unavailable = beat.get("unavailable")
        if isinstance(unavailable, dict):
            for engine, reason in unavailable.items():
                out.setdefault(str(engine), str(reason))
    return out


def upstreams(beats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each remote model's replicas, over every live child that used them: requests in flight and
    made, failures, the latest time to first audio, and down when every child using it says so;
    with the cloned voices kept there and the deletions owed to it (services/upstream_voices.py),
    also for a replica no child uses any more."""
    empty = {"in_flight": 0, "requests": 0, "failures": 0, "first_audio_ms": None, "down": True}
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for beat in beats:
        models = beat.get("upstreams")
        if not isinstance(models, dict):
            continue
        for model, replicas in models.items():
            for figures in replicas if isinstance(replicas, list) else []:
                row = merged.setdefault((str(model), str(figures.get("url"))), dict(empty))
                for key in ("in_flight", "requests", "failures"):
                    row[key] += int(figures.get(key) or 0)
                if figures.get("first_audio_ms") is not None:
                    row["first_audio_ms"] = figures["first_audio_ms"]
                row["down"] = row["down"] and bool(figures.get("down"))
    voices = upstream_voices.counts()
    for pair in voices:
        merged.setdefault(pair, {**empty, "down": False})
    return [
        {"model": model, "url": url, **row, **voices.get((model, url), {"kept": 0, "owed": 0})}
        for (model, url), row in sorted(merged.items())
    ]


def queue_depths(client: Any, queues: list[str]) -> dict[str, int]:
    """Messages waiting in the broker, per queue (all priority lists added up)."""
    pipe = client.pipeline()
    for queue in queues:
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(queue + suffix)
    lengths = pipe.execute()
    step = len(_PRIORITY_SUFFIXES)
    return {q: int(sum(lengths[i * step : (i + 1) * step])) for i, q in enumerate(queues)}


class Percentile(Aggregate):
    """The continuous ``fraction`` percentile of an expression (PostgreSQL's ``percentile_cont``).

    An ordered-set aggregate (``WITHIN GROUP (ORDER BY ...)``), which Django has
    no class for; ``fraction`` is a constant of this module, never a request's.
    """

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float) -> None:
        super().__init__(expression, fraction=float(fraction))


def job_figures(since: dt.datetime) -> dict[str, Any]:
    """Jobs created since ``since`` per status; p50/p95 queue wait (s) and RTF of those finished since."""
    by_status = dict(
        SynthesisJob.objects.filter(created_at__gte=since)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    measured = (
        SynthesisJob.objects.filter(status=SynthesisJob.Status.SUCCEEDED, finished_at__gte=since)
        .annotate(
            queue_s=Cast(KT("metrics__queue_ms"), FloatField()) / 1000,
            rtf=Cast(KT("metrics__rtf"), FloatField()),
        )
        .filter(queue_s__isnull=False, rtf__isnull=False)
        .aggregate(
            wait50=Percentile("queue_s", 0.5),
            wait95=Percentile("queue_s", 0.95),
            rtf50=Percentile("rtf", 0.5),
            rtf95=Percentile("rtf", 0.95),
            n=Count("id"),
        )
    )
    return {
        "by_status": {s: int(by_status.get(s, 0)) for s in SynthesisJob.Status.values},
        "queue_wait_p50": _round(measured["wait50"]),
        "queue_wait_p95": _round(measured["wait95"]),
        "rtf_p50": _round(measured["rtf50"], 4),
        "rtf_p95": _round(measured["rtf95"], 4),
        "measured": int(measured["n"] or 0),
    }


def _round(value: Any, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def event_nodes(client: Any) -> list[str]:
    """Every node with recent events (kept 7 days), live or not."""
    prefix = recycling.NODE_EVENTS_PREFIX
    return sorted(str(k)[len(prefix) :] for k in client.scan_iter(match=prefix + "*", count=200))


def recycles_since(client: Any, since: float) -> list[dict[str, Any]]:
    """Recycle events of every node since ``since`` (epoch seconds), newest first."""
    out = []
    for node in event_nodes(client):
        try:
            events = recycling.node_events(client, node)
        except ValueError:  # one corrupt entry must not hide the rest
            continue
        for event in events:
            at = _num(event.get("at")) if isinstance(event, dict) else None
            if at is not None and at >= since and event.get("event") == "recycle":
                reason = str(event.get("reason") or "")
                out.append({**event, "node": node, "kind": recycling.reason_kind(reason), "reason": reason})
    return sorted(out, key=lambda e: -float(e["at"]))


def closest_recycle(beat: dict[str, Any], now: float) -> str:
    """Of a child's recycle limits, the one it is nearest to, as "what, how far (percent used)"."""
    if beat.get("recycle_reason"):
        return "leaving: " + str(beat["recycle_reason"])
    limits = beat.get("limits")
    limits = limits if isinstance(limits, dict) else {}
    loaded, deadline = _num(beat.get("loaded_at")), _num(beat.get("recycle_at"))
    candidates: list[tuple[float, str]] = []
    for what, used, limit, unit in (
        ("rss", _num(beat.get("rss_mb")), _num(limits.get("max_rss_mb")), "MiB"),
        ("gpu_memory", _num(beat.get("gpu_mb")), _num(limits.get("max_gpu_mb")), "MiB"),
        ("max_tasks", _num(beat.get("tasks_done")), _num(beat.get("max_tasks_per_child")), "tasks"),
    ):
        if used is not None and limit:
            candidates.append((used / limit, f"{what} {used:,.0f} of {limit:,.0f} {unit}"))
    if loaded is not None and deadline is not None and deadline > loaded:
        left = max(0.0, deadline - now)
        candidates.append(((now - loaded) / (deadline - loaded), f"age limit in {left / 60:,.0f} min"))
    if not candidates:
        return "-"
    share, text = max(candidates)
    return f"{text} ({share:.0%})"


def collect(now: float | None = None) -> dict[str, Any]:
    """What the page shows now (raw values; the view formats them)."""
    now = time.time() if now is None else now
    client = redis_clients.heartbeats()
    beats = [b for b in heartbeat.live_workers() if isinstance(b, dict)]
    since = timezone.now() - dt.timedelta(hours=1)
    return {
        "at": now,
        "beats": beats,
        "queues": queue_depths(client, queue_names(beats)),
        "queued_jobs": dict(
            SynthesisJob.objects.filter(status=SynthesisJob.Status.QUEUED)
            .order_by()
            .values_list("engine")
            .annotate(n=Count("id"))
            .values_list("engine", "n")
        ),
        "jobs": job_figures(since),
        "recycles": recycles_since(client, now - DAY),
    }


def snapshot(figures: dict[str, Any]) -> dict[str, Any]:
    """The compact per-minute record of ``collect()``'s figures."""
    beats = figures["beats"]
    rss = [_num(b.get("rss_mb")) or 0.0 for b in beats]
    gpu = [_num(b.get("gpu_mb")) or 0.0 for b in beats]
    jobs = figures["jobs"]
    return {
        "children": len(beats),
        "ready": sum(1 for b in beats if b.get("state") == "ready"),
        "rss_mb_max": max(rss, default=0.0),
        "rss_mb_total": round(sum(rss), 1),
        "gpu_mb_total": round(sum(gpu), 1),
        "queue_depth": sum(figures["queues"].values()),
        "queued_jobs": sum(figures["queued_jobs"].values()),
        "jobs_hour": jobs["by_status"],
        **{k: jobs[k] for k in ("queue_wait_p50", "queue_wait_p95", "rtf_p50", "rtf_p95")},
        "recycles_hour": sum(1 for r in figures["recycles"] if float(r["at"]) >= figures["at"] - HOUR),
    }
