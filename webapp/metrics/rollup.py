"""Job and ledger counters, derived from the rows into Redis, for /metrics.

:func:`advance` counts the rows of one window, from the last watermark to
``LAG`` seconds ago (a write commits well within that): jobs submitted
(``created_at``), jobs finished by status (``finished_at``), queue wait and
synthesis time of the succeeded ones, characters charged per plan. It adds
them to one Redis hash and moves the watermark in the same transaction, under
a short lock, so two callers never count a window twice. The minute snapshot
job and every scrape call it. Counting starts at the first call (no back-fill);
a Redis that loses the hash starts again from zero, which Prometheus reads as
a counter reset.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connection
from django.db.models import Count, Sum

from webapp import redis_clients
from webapp.speech.models import SynthesisJob, UsageEvent

COUNTERS_KEY = "tts:metrics:counters"
WATERMARK_KEY = "tts:metrics:watermark"
LOCK_KEY = "tts:metrics:rollup-lock"
LAG = dt.timedelta(seconds=10)
SEP = "|"
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
SYNTH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HISTOGRAMS = {"queue_wait": WAIT_BUCKETS, "synthesis": SYNTH_BUCKETS}


def field(*parts: str) -> str:
    return SEP.join(parts)


def _bucket(value: float, bounds: tuple[float, ...]) -> str:
    return next((str(b) for b in bounds if value <= b), "+Inf")


def window_counts(start: dt.datetime, end: dt.datetime) -> tuple[dict[str, int], dict[str, float]]:
    """(integer increments, float increments) for the rows of ``(start, end]``."""
    ints: dict[str, int] = {}
    floats: dict[str, float] = {}
    jobs = SynthesisJob.objects.order_by()
    for engine, n in (
        jobs.filter(created_at__gt=start, created_at__lte=end).values_list("engine").annotate(Count("id"))
    ):
        ints[field("submitted", engine)] = n
    finished = jobs.filter(finished_at__gt=start, finished_at__lte=end)
    for engine, status, n in finished.values_list("engine", "status").annotate(Count("id")):
        ints[field("finished", engine, status)] = n
    for engine, metrics in finished.filter(status=SynthesisJob.Status.SUCCEEDED).values_list(
        "engine", "metrics"
    ):
        _add_timings(ints, floats, engine, metrics if isinstance(metrics, dict) else {})
    charges = UsageEvent.objects.filter(
        kind=UsageEvent.Kind.CHARGE, created_at__gt=start, created_at__lte=end
    ).order_by()
    for plan, characters in charges.values_list("organization__plan__slug").annotate(Sum("characters")):
        ints[field("charged", str(plan))] = int(characters or 0)
    return ints, floats


def _add_timings(
    ints: dict[str, int], floats: dict[str, float], engine: str, metrics: dict[str, Any]
) -> None:
    device = str(metrics.get("device") or "unknown")
    for name, raw, scale in (
        ("queue_wait", metrics.get("queue_ms"), 1000),
        ("synthesis", metrics.get("synth_ms"), 1000),
    ):
        if not isinstance(raw, int | float) or isinstance(raw, bool):
            continue
        seconds = float(raw) / scale
        key = field(name, engine, device, _bucket(seconds, HISTOGRAMS[name]))
        ints[key] = ints.get(key, 0) + 1
        floats[field(name + "_sum", engine, device)] = (
            floats.get(field(name + "_sum", engine, device), 0.0) + seconds
        )


def database_now() -> dt.datetime:
    """PostgreSQL's clock: the rows' finish times are written by it, so the windows follow it too."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        row = cursor.fetchone()
    now: dt.datetime = row[0]
    return now


def advance(now: dt.datetime | None = None) -> bool:
    """Count the rows up to ``LAG`` ago. False when another caller holds the lock or nothing is due.

    ``now`` defaults to the database clock, not this host's: every web process
    and the snapshot job move one watermark, and a host whose clock ran ahead
    would move it past rows not yet written, which no window would then count.
    """
    client = redis_clients.heartbeats()
    if not client.set(LOCK_KEY, "1", nx=True, ex=60):
        return False
    try:
        end = (now or database_now()) - LAG
        raw = client.get(WATERMARK_KEY)
        if raw is None:
            client.set(WATERMARK_KEY, end.isoformat())
            return False
        start = dt.datetime.fromisoformat(str(raw))
        if end <= start:
            return False
        ints, floats = window_counts(start, end)
        pipe = client.pipeline(transaction=True)
        for key, amount in ints.items():
            pipe.hincrby(COUNTERS_KEY, key, amount)
        for key, value in floats.items():
            pipe.hincrbyfloat(COUNTERS_KEY, key, value)
        pipe.set(WATERMARK_KEY, end.isoformat())
        pipe.execute()
        return True
    finally:
        client.delete(LOCK_KEY)


def read() -> dict[str, float]:
    raw = redis_clients.heartbeats().hgetall(COUNTERS_KEY) or {}
    return {str(k): float(v) for k, v in raw.items()}
