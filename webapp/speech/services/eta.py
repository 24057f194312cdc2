"""Queue position and ETA of a job, from the engine's rolling speed and the live children."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from webapp.rawrows import fetch_one
from webapp.speech import heartbeat
from webapp.speech.models import ACTIVE_STATUSES, JobStatus, SynthesisJob, sql_status_in
from webapp.speech.services.dispatch import scales_to_zero

log = logging.getLogger(__name__)

Status = SynthesisJob.Status

# Seconds of synthesis per billable character when an engine has no history yet
# (Piper on 2 CPU cores runs near 0.004 s/char; this errs on the slow side).
DEFAULT_SECONDS_PER_CHAR = 0.01
ETA_SAMPLE_JOBS = 20
# Recent successes one ETA reads (one query): room for ETA_SAMPLE_JOBS on a few devices.
ETA_SCAN_JOBS = 100
# How long a process reuses an engine's basis. Reading it (the last ETA_SCAN_JOBS
# successes and the heartbeats) cost 1.3 ms of CPU, and every job answer and
# long-poll wake-up needed it: 200 long-polls woken within a second read it once
# per job and process. A figure that rests on the last hundred jobs does not
# change within a second.
BASIS_MAX_AGE_SECONDS = 1.0


@dataclass(frozen=True)
class EtaBasis:
    """What the ETAs of one engine rest on; read once per engine per response.

    ``seconds_per_char`` is for one child: the pool's mean over the devices now
    serving the engine, weighted by their children (see ``eta_basis``).
    ``children`` is the number of live worker children serving the engine (at
    least 1, so an ETA exists while no worker is up). ``cold_start`` is what a
    queued job waits for a pool at zero to come up (``TTS_POOL_COLD_START_SECONDS``
    on a scale-to-zero queue with no live child; else 0).
    """

    seconds_per_char: float
    children: int
    devices: dict[str, int]
    cold_start: float = 0.0


def _serving(engine: str, workers: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The heartbeats of live children serving ``engine``.

    A child counts when it is ready (or recycling, about to be ready again) and its worker is
    configured for the engine. Redis being down only loses the count (callers then assume one
    child), never the API answer.
    """
    if workers is None:
        try:
            workers = heartbeat.live_workers()
        except Exception as exc:
            log.warning("counting children without heartbeats: %s", exc)
            workers = []
    return [
        w
        for w in workers
        if w.get("state") in heartbeat.SERVING_STATES and engine in (w.get("engines") or [])
    ]


def serving_children(engine: str, workers: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """Live worker children serving ``engine``, counted by device, from the heartbeats."""
    out: dict[str, int] = {}
    for w in _serving(engine, workers):
        device = str(w.get("device") or "cpu")
        out[device] = out.get(device, 0) + 1
    return out


def serving_slots(engine: str, workers: list[dict[str, Any]] | None = None) -> int:
    """Jobs of ``engine`` its live children run at once, all together: one per child, a batching
    child's group size (its heartbeat's ``job_slots``; a heartbeat without them counts one)."""
    slots = 0
    for w in _serving(engine, workers):
        per_engine = w.get("job_slots")
        slots += max(1, int(per_engine.get(engine) or 1)) if isinstance(per_engine, dict) else 1
    return slots


def rolling_seconds_per_char(engine: str) -> tuple[dict[str, float], float | None]:
    """Rolling mean synthesis seconds per character of an engine: (by device, all devices).

    One query reads the engine's last ETA_SCAN_JOBS successes (only device,
    synth_ms and characters). Per device the mean is over that device's last
    ETA_SAMPLE_JOBS of them, and over the last ETA_SAMPLE_JOBS whatever the
    device; weighted by length, sum(synth_ms) / sum(text_chars), so a few tiny
    jobs do not dominate. None / a missing device: no usable history.
    """
    rows = (
        SynthesisJob.objects.filter(engine=engine, status=Status.SUCCEEDED, text_chars__gt=0)
        .order_by("-finished_at")
        .values_list("metrics__device", "metrics__synth_ms", "text_chars")[:ETA_SCAN_JOBS]
    )
    sums: dict[str, list[float]] = {}  # device -> [synth ms, chars, jobs]
    all_ms = 0.0
    all_chars = 0
    all_jobs = 0
    for device, synth_ms, chars in rows:
        if not isinstance(synth_ms, int | float) or isinstance(synth_ms, bool) or synth_ms < 0:
            continue
        if all_jobs < ETA_SAMPLE_JOBS:
            all_ms += float(synth_ms)
            all_chars += chars
            all_jobs += 1
        acc = sums.setdefault(str(device or "cpu"), [0.0, 0.0, 0.0])
        if acc[2] < ETA_SAMPLE_JOBS:
            acc[0] += float(synth_ms)
            acc[1] += chars
            acc[2] += 1
    by_device = {d: ms / 1000.0 / chars for d, (ms, chars, _) in sums.items() if ms > 0 and chars > 0}
    overall = all_ms / 1000.0 / all_chars if all_ms > 0 and all_chars > 0 else None
    return by_device, overall


_bases: dict[str, tuple[float, EtaBasis]] = {}  # engine -> (monotonic time read, basis)


def forget_bases() -> None:
    """Drop this process's saved bases (the next ETA reads its engine's afresh)."""
    _bases.clear()


def eta_basis(engine: str, workers: list[dict[str, Any]] | None = None) -> EtaBasis:
    """Seconds per character and children for the ETAs of ``engine``: read at most once per
    ``BASIS_MAX_AGE_SECONDS`` per process (a read is one query and one Redis read); given
    ``workers``, computed from them now.

    With n_d live children on device d, each at s_d seconds per character
    (its rolling mean; the engine's all-device mean where the device has no
    history, DEFAULT_SECONDS_PER_CHAR where the engine has none):
        N = sum(n_d)                       children serving the engine
        s = N / sum(n_d / s_d)             one child's mean (the pool synthesises
                                           sum(n_d / s_d) characters per second)
    No live child: N = 1 and s = the engine's all-device mean, and on a queue that
    scales to zero a cold start C = ``TTS_POOL_COLD_START_SECONDS``.
    """
    if workers is None:
        saved = _bases.get(engine)
        now = time.monotonic()
        if saved is not None and now - saved[0] < BASIS_MAX_AGE_SECONDS:
            return saved[1]
        basis = _read_basis(engine, None)
        _bases[engine] = (now, basis)
        return basis
    return _read_basis(engine, workers)


def _read_basis(engine: str, workers: list[dict[str, Any]] | None) -> EtaBasis:
    devices = serving_children(engine, workers)
    by_device, overall = rolling_seconds_per_char(engine)
    fallback = overall if overall is not None else DEFAULT_SECONDS_PER_CHAR
    children = sum(devices.values())
    if children == 0:
        cold_start = float(settings.TTS_POOL_COLD_START_SECONDS) if scales_to_zero(engine) else 0.0
        return EtaBasis(fallback, 1, {}, cold_start)
    chars_per_second = sum(n / by_device.get(d, fallback) for d, n in devices.items())
    return EtaBasis(children / chars_per_second, children, devices)


def estimate_eta(job: SynthesisJob, basis: EtaBasis | float | None = None) -> float | None:
    """Seconds until the job is likely done; None once finished (``estimate`` says how)."""
    return estimate(job, basis)[0]


def estimate(job: SynthesisJob, basis: EtaBasis | float | None = None) -> tuple[float | None, int | None]:
    """(ETA in seconds, queue position) of a job: (None, None) once finished; no position once running.

    The queue position is the number of queued jobs of the same engine (any
    tenant) created before this one; 0 = next.

    With s and N from ``eta_basis(engine)``:
      running: eta = s * text_chars * (1 - progress)
      queued:  ahead = queued jobs of the engine created before it + running jobs of the engine
               work  = their characters (running ones: text_chars * (1 - progress))
               wait  = 0 if ahead < N (a child is free for it) else s * work / N
               eta   = C + wait + s * text_chars   (C: the cold start of a pool at zero, else 0)
    The jobs ahead are shared among the N children, so the wait is their work
    divided by N; the job itself runs on one child. A bare float ``basis`` is a
    seconds-per-character figure with one child.
    """
    if job.is_finished:
        return None, None
    if basis is None:
        basis = eta_basis(job.engine)
    elif not isinstance(basis, EtaBasis):
        basis = EtaBasis(float(basis), 1, {})
    spc = basis.seconds_per_char
    if job.status == Status.RUNNING:
        return round(spc * job.text_chars * (1.0 - job.progress), 1), None
    # One query for the position and both parts of the wait: it runs on every answer about a
    # queued job, so it is written once (webapp/rawrows.py): 1.7 ms of CPU less than its ORM form.
    row = fetch_one(_AHEAD, {"engine": job.engine, "created": job.created_at})
    queued_n, queued_chars, running_n, running_chars = row or (0, 0, 0, 0)
    work = float(queued_chars) + float(running_chars)
    wait = 0.0 if queued_n + running_n < basis.children else spc * work / basis.children
    return round(basis.cold_start + wait + spc * job.text_chars, 1), int(queued_n)


_QUEUED, _RUNNING = sql_status_in((JobStatus.QUEUED,)), sql_status_in((JobStatus.RUNNING,))
_AHEAD = f"""
    SELECT count(*) FILTER (WHERE {_QUEUED} AND created_at < %(created)s),
        coalesce(sum(text_chars) FILTER (WHERE {_QUEUED} AND created_at < %(created)s), 0),
        count(*) FILTER (WHERE {_RUNNING}),
        coalesce(sum(text_chars * (1.0 - progress)) FILTER (WHERE {_RUNNING}), 0)
    FROM {SynthesisJob._meta.db_table}
    WHERE engine = %(engine)s AND {sql_status_in(ACTIVE_STATUSES)}"""
