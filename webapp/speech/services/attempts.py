"""The worker side of the job state machine: claims, fenced writes, the reaper, lost deliveries.

Each claim increments the job's ``claim_token`` (the fencing token) and the
attempt carries it in every later write: progress, complete, fail, requeue
and cancel match only ``status='running' AND claim_token=<token>``. A paused
or partitioned owner whose job was handed on can therefore change nothing,
and it learns so at its next progress write. Leases, deadlines and progress
times come from the database clock (``now()``), never from a host's.

A message is a wake-up: the woken worker re-claims its own job when that
job's owner is dead, or else takes the fairest queued job of the engine (the
tenant with the fewest running jobs, then the oldest job), so one tenant's
burst cannot hold every worker and a lost message costs nothing while any
other message arrives. The beat jobs end what no worker will: stalled or
over-time runs (``timeout``), expired leases (re-queued), messages lost after
dispatch (re-sent once per ``TTS_JOB_REDELIVER_SECONDS``) and jobs queued too
long (``queue_timeout``).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from psycopg.types.json import Jsonb

from webapp.rawrows import columns, fetch_one
from webapp.speech.models import ClaimProtocol, SynthesisJob
from webapp.speech.services import dispatch, ledger, notify, outputs
from webapp.speech.services.jobs import _cancel, _end, _fail, _requeue
from webapp.tenants.models import Organization, Plan

log = logging.getLogger(__name__)

Status = SynthesisJob.Status
TABLE = SynthesisJob._meta.db_table

# Bumped whenever the claim protocol changes incompatibly; the migration that
# introduces a version records it in ClaimProtocol (speech 0003: version 2).
CLAIM_PROTOCOL = 2


class ProtocolMismatch(RuntimeError):
    """The database speaks a newer claim protocol than this worker's code."""


class Verdict(StrEnum):
    """What a progress write tells the attempt."""

    GO = "go"
    CANCEL = "cancel"  # the client canceled: stop before the next sentence
    LOST = "lost"  # another attempt owns the job, or it ended: stop at once


def check_claim_protocol() -> int:
    """Refuse to claim against a schema whose claim protocol is newer than this code's."""
    newest = ClaimProtocol.objects.order_by("-version").values_list("version", flat=True).first() or 0
    if newest > CLAIM_PROTOCOL:
        raise ProtocolMismatch(
            f"the database speaks claim protocol {newest}, this worker {CLAIM_PROTOCOL}: upgrade the worker"
        )
    return newest


def _job_uuid(job_id: Any) -> uuid.UUID:
    return job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))


# --------------------------------------------------------------------- claims

# The deadline is the hard ceiling (dispatch.job_time_limits): the hard limit that came
# with the message for the message's own job, else the claimed job's own from its length.
_SET_CLAIMED = f"""
    status = 'running', claim_token = {TABLE}.claim_token + 1, attempts = {TABLE}.attempts + 1,
    worker = %(worker)s, stage = 'loading voice', progress = 0,
    lease_until = now() + make_interval(secs => %(lease)s),
    deadline = now() + make_interval(secs => COALESCE(
        CASE WHEN {TABLE}.id = %(hinted)s::uuid THEN %(hard)s::float8 END,
        LEAST(%(wall)s::float8 * LEAST(%(base)s::float8 + %(per_char)s::float8 * {TABLE}.text_chars,
                                       %(max)s::float8), %(max)s::float8) + %(grace)s::float8)),
    progress_at = now(), started_at = COALESCE({TABLE}.started_at, now())
"""


def _claim_params(worker_id: str, hinted: Any = None, hard: float | None = None) -> dict[str, Any]:
    return {
        "worker": worker_id,
        "lease": float(settings.TTS_JOB_LEASE_SECONDS),
        "hinted": _job_uuid(hinted) if hinted else None,
        "hard": None if hard is None else float(hard),
        "base": float(settings.TTS_JOB_BASE_SECONDS),
        "per_char": float(settings.TTS_JOB_SECONDS_PER_CHAR),
        "max": float(settings.TTS_MAX_JOB_SECONDS),
        "wall": float(settings.TTS_JOB_WALL_FACTOR),
        "grace": float(settings.TTS_JOB_HARD_GRACE_SECONDS),
        "max_attempts": settings.TTS_JOB_MAX_ATTEMPTS,
    }


def _claimed(sql: str, params: dict[str, Any]) -> SynthesisJob | None:
    """Run one ``UPDATE ... RETURNING`` (``_claimed_columns``): the claim and the row it took in one statement."""
    with transaction.atomic(durable=True):
        row = fetch_one(sql, params)
        job: SynthesisJob | None = None if row is None else columns(SynthesisJob, TABLE).build(row)
        if job is not None:
            notify.job_changed(job.id, job.status, job.progress)
    return job


def _claimed_columns() -> str:
    """What a claim returns: the job's fields in the order ``_claimed`` builds it from."""
    return columns(SynthesisJob, TABLE).sql


def claim_job(
    job_id: Any,
    worker_id: str,
    dead_workers: tuple[str, ...] | list[str] = (),
    *,
    suspect: str = "",
    hard_seconds: float | None = None,
) -> SynthesisJob | None:
    """Take this job: queued, or running under an owner that is gone.

    ``dead_workers``: owners known dead (their pid is gone on this host), taken
    at once. ``suspect``: an owner elsewhere whose heartbeat is missing, taken
    only once its lease has expired by the database clock. A dead owner's job
    past its deadline is not taken again: it ends ``timeout``.
    """
    params = _claim_params(worker_id, job_id, hard_seconds)
    params.update(id=_job_uuid(job_id), dead=[w for w in dead_workers if w] or [""], suspect=suspect or "")
    sql = f"""
        UPDATE {TABLE} SET {_SET_CLAIMED}
        WHERE id = %(id)s AND NOT cancel_requested AND attempts < %(max_attempts)s
          AND (status = 'queued' OR (status = 'running' AND COALESCE(deadline > now(), true)
               AND (worker = ANY(%(dead)s::text[]) OR (worker = %(suspect)s AND lease_until < now()))))
        RETURNING {_claimed_columns()}"""
    job = _claimed(sql, params)
    if job is None:
        close_unclaimable(job_id, list(dead_workers))
    return job


def claim_next(
    engine: str, worker_id: str, hinted: Any = None, hard_seconds: float | None = None
) -> SynthesisJob | None:
    """Take the fairest queued job of ``engine``: the tenant running the fewest jobs, then the oldest.

    ``SKIP LOCKED``: concurrent claimers take different jobs instead of waiting
    on each other. ``hinted`` is the message's job, whose hard limit came with it.
    """
    params = _claim_params(worker_id, hinted, hard_seconds)
    params["engine"] = engine
    sql = f"""
        WITH running AS (
            SELECT organization_id, count(*) AS n FROM {TABLE} WHERE status = 'running' GROUP BY organization_id
        ), pick AS (
            SELECT j.id FROM {TABLE} j LEFT JOIN running r ON r.organization_id = j.organization_id
            WHERE j.status = 'queued' AND j.engine = %(engine)s AND NOT j.cancel_requested
              AND j.attempts < %(max_attempts)s
            ORDER BY COALESCE(r.n, 0), j.created_at, j.id
            LIMIT 1 FOR UPDATE OF j SKIP LOCKED
        )
        UPDATE {TABLE} SET {_SET_CLAIMED}
        FROM pick WHERE {TABLE}.id = pick.id AND {TABLE}.status = 'queued'
        RETURNING {_claimed_columns()}"""
    return _claimed(sql, params)


def close_unclaimable(job_id: Any, dead_workers: list[str] | tuple[str, ...] = ()) -> None:
    """A job no one may claim must not stay open for ever: cancel it, give up on it, or time it out."""
    gone = Q(status=Status.QUEUED) | Q(status=Status.RUNNING, worker__in=[w for w in dead_workers if w])
    with transaction.atomic(durable=True):
        if _cancel(job_id, gone & Q(cancel_requested=True)) is not None:
            return
        row = SynthesisJob.objects.filter(gone, id=job_id).values_list("attempts", "status").first()
        if row is None:
            return
        if row[1] == Status.RUNNING and _past_deadline(job_id):
            _fail(job_id, "timeout", "The job ran past its time limit and was stopped.", gone)
        elif row[0] >= settings.TTS_JOB_MAX_ATTEMPTS:
            attempts = row[0]
            _fail(job_id, "worker_lost", f"The job stopped its worker {attempts} times; giving up.", gone)


def _past_deadline(job_id: Any) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT deadline < now() FROM {TABLE} WHERE id = %s", [_job_uuid(job_id)])
        row = cursor.fetchone()
    return bool(row and row[0])


# --------------------------------------------------------------------- fenced writes


def _current(token: int) -> Q:
    return Q(status=Status.RUNNING, claim_token=token)


def report_progress(job_id: Any, token: int, done: int, total: int, stage: str | None = None) -> Verdict:
    """Record progress and renew the lease, in one statement; say whether to go on."""
    progress = 0.0 if total <= 0 else min(1.0, done / total)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET stage = %s, lease_until = now() + make_interval(secs => %s), "
            "progress_at = CASE WHEN %s > progress THEN now() ELSE progress_at END, progress = %s "
            "WHERE id = %s AND status = 'running' AND claim_token = %s RETURNING cancel_requested",
            [
                (stage or f"synthesising {min(done + 1, total)}/{total}")[:100],
                float(settings.TTS_JOB_LEASE_SECONDS),
                progress,
                progress,
                _job_uuid(job_id),
                token,
            ],
        )
        row = cursor.fetchone()
    if row is None:
        return Verdict.LOST
    notify.job_changed(job_id, Status.RUNNING, progress)
    return Verdict.CANCEL if row[0] else Verdict.GO


def complete_job(
    job_id: Any,
    token: int,
    *,
    audio_path: str,
    audio_bytes: int,
    duration_seconds: float,
    metrics: dict[str, Any],
    applied_instructions: dict[str, Any],
) -> bool:
    """Publish this attempt's file as the job's audio and charge it, exactly once.

    Under the row lock and only for the current token: the row then names the
    winning attempt's own file. A cancel requested meanwhile ends the job
    canceled instead, nothing charged; False tells the worker its file is not
    the job's audio.
    """
    params = {
        "id": _job_uuid(job_id),
        "token": token,
        "now": timezone.now(),
        "path": audio_path,
        "bytes": audio_bytes,
        "duration": duration_seconds,
        "metrics": Jsonb(metrics),
        "applied": Jsonb(applied_instructions),
    }
    with transaction.atomic(durable=True):
        row = fetch_one(_COMPLETE, params)
        if row is None:
            # Taken over (a no-op here), or a cancel was asked for meanwhile: then it ends canceled.
            _cancel(job_id, _current(token) & Q(cancel_requested=True))
            return False
        notify.job_changed(job_id, Status.SUCCEEDED, 1.0)
        # The charge needs the job's id and tenant only: an instance of those two fields.
        ledger.charge_usage(SynthesisJob.from_db(connection.alias, ["id", "organization_id"], list(row)))
    return True


# complete_job's transition in one statement: the row lock, the check that this attempt
# still owns the job and no cancel was asked for, and the expiry from the tenant's plan
# (the ORM's way was a locking read of the job with its tenant and plan, then an UPDATE of
# eleven fields: 5 ms of the worker's CPU per job for the whole completion, against 2 now).
_COMPLETE = f"""
    UPDATE {TABLE} SET status = 'succeeded', progress = 1, stage = 'done', finished_at = %(now)s,
        lease_until = NULL, audio_path = %(path)s, audio_bytes = %(bytes)s,
        duration_seconds = %(duration)s, metrics = %(metrics)s, applied_instructions = %(applied)s,
        expires_at = %(now)s + make_interval(days => (
            SELECT p.retention_days FROM {Organization._meta.db_table} o
            JOIN {Plan._meta.db_table} p ON p.id = o.plan_id WHERE o.id = {TABLE}.organization_id))
    WHERE id = %(id)s AND status = 'running' AND claim_token = %(token)s AND NOT cancel_requested
    RETURNING id, organization_id"""


def fail_job(job_id: Any, code: str, message: str, token: int | None = None) -> bool:
    """Mark an active job failed and release it; with ``token`` only while that attempt owns it."""
    allowed = Q(status__in=SynthesisJob.ACTIVE) if token is None else _current(token)
    with transaction.atomic(durable=True):
        return _fail(job_id, code, message, allowed) is not None


def requeue_job(
    job_id: Any, token: int | None = None, reason: str = "", oom: bool = False, count_attempt: bool = True
) -> bool:
    """Put a running job back in the queue; with ``token`` only while that attempt owns it.

    ``oom`` counts an out-of-memory retry (granted once); ``count_attempt=False``
    gives the attempt back (a run handed back at shutdown did nothing wrong).
    """
    allowed = Q(status=Status.RUNNING) if token is None else _current(token)
    changes: dict[str, Any] = {"queued_at": timezone.now()}
    if oom:
        changes["oom_retries"] = F("oom_retries") + 1
    if not count_attempt:
        changes["attempts"] = F("attempts") - 1
    with transaction.atomic(durable=True):
        return _requeue(job_id, allowed, reason, **changes)


def finish_canceled(job_id: Any, token: int) -> bool:
    """The attempt stopped at a cancel check: end the job canceled while this attempt owns it."""
    with transaction.atomic(durable=True):
        return _cancel(job_id, _current(token) & Q(cancel_requested=True)) is not None


# --------------------------------------------------------------------- reaper


def reap_running(limit: int = 500) -> dict[str, int]:
    """End or re-queue running jobs no live attempt is moving, each decided under its row lock.

    Past the deadline or stalled (no progress for TTS_JOB_STALL_SECONDS):
    ``timeout``, released, not retried. Lease expired: re-queued, or
    ``worker_lost`` once the attempts are spent. All times by ``now()``.
    """
    counts = {"requeued": 0, "failed": 0, "timeout": 0, "canceled": 0}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {TABLE} WHERE status = 'running' AND (lease_until < now() OR deadline < now() "
            "OR progress_at < now() - make_interval(secs => %s)) ORDER BY id LIMIT %s",
            [float(settings.TTS_JOB_STALL_SECONDS), limit],
        )
        ids = [row[0] for row in cursor.fetchall()]
    for job_id in ids:
        with transaction.atomic(durable=True):
            outcome = _reap_one(job_id)
        if outcome in counts:
            counts[outcome] += 1
    return counts


def _reap_one(job_id: Any) -> str:
    stall = float(settings.TTS_JOB_STALL_SECONDS)
    # Locked first, then judged with the database clock: a lease renewed meanwhile counts.
    rows = list(
        SynthesisJob.objects.raw(
            f"SELECT *, deadline < now() AS past_deadline, "
            "progress_at < now() - make_interval(secs => %s) AS stalled, lease_until < now() AS expired "
            f"FROM {TABLE} WHERE id = %s AND status = 'running' FOR UPDATE",
            [stall, job_id],
        )
    )
    if not rows:
        return "skipped"
    job = rows[0]
    outcome = _reap_locked(job, stall)
    if outcome != "skipped":
        _discard_if_owner_dead(job)
    return outcome


def _reap_locked(job: Any, stall: float) -> str:
    mine = _current(job.claim_token)
    if job.past_deadline or job.stalled:
        why = "ran past its time limit" if job.past_deadline else f"made no progress for {stall:g} s"
        _fail(job.id, "timeout", f"The job {why} and was stopped.", mine)
        return "timeout"
    if not job.expired:
        return "skipped"
    if job.cancel_requested:
        _cancel(job.id, mine)
        return "canceled"
    if job.attempts >= settings.TTS_JOB_MAX_ATTEMPTS:
        _fail(job.id, "worker_lost", f"The worker running this job was lost {job.attempts} times.", mine)
        return "failed"
    return "requeued" if _requeue(job.id, mine, "lease expired", queued_at=timezone.now()) else "skipped"


def _discard_if_owner_dead(job: SynthesisJob) -> None:
    """The released attempt's files go now when its owner is known dead (same host, pid gone).

    An owner that may be alive (elsewhere, or only paused) still owns its files:
    it removes them itself when it learns it lost, or the orphan sweep does.
    """
    from webapp.speech import worker  # liveness by pid; the reaper runs in a worker process

    if job.worker and worker.owner_is_local(job.worker) and worker.owner_is_dead(job.worker):
        outputs.discard_attempt(job, job.claim_token)


def requeue_expired_leases(limit: int = 500) -> tuple[int, int]:
    """(re-queued, failed) of one reaper pass; see :func:`reap_running`."""
    counts = reap_running(limit)
    return counts["requeued"], counts["failed"] + counts["timeout"]


# --------------------------------------------------------------------- lost deliveries


def resend_lost_deliveries(limit: int = 500) -> tuple[int, int]:
    """(re-sent, timed out): queued jobs whose message may be lost, and jobs queued too long.

    A job dispatched more than TTS_JOB_REDELIVER_SECONDS ago and still queued
    gets its message again (``dispatched_at`` moves on, so once per period);
    a duplicate is harmless, the claim is conditional. One queued longer than
    TTS_JOB_MAX_QUEUE_SECONDS ends ``queue_timeout`` and is released.
    """
    now = timezone.now()
    too_old = now - dt.timedelta(seconds=settings.TTS_JOB_MAX_QUEUE_SECONDS)
    queued = SynthesisJob.objects.filter(status=Status.QUEUED)
    expired = list(
        queued.filter(Q(queued_at__lt=too_old) | Q(queued_at__isnull=True, created_at__lt=too_old))
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    timed_out = 0
    for job_id in expired:
        with transaction.atomic(durable=True):
            message = f"No worker took the job within {settings.TTS_JOB_MAX_QUEUE_SECONDS} s."
            timed_out += (
                _end(
                    job_id,
                    Q(status=Status.QUEUED),
                    Status.FAILED,
                    error_code="queue_timeout",
                    error_message=message,
                )
                is not None
            )
    cutoff = now - dt.timedelta(seconds=settings.TTS_JOB_REDELIVER_SECONDS)
    lost = list(
        queued.filter(dispatched_at__lt=cutoff).order_by("dispatched_at").values_list("id", flat=True)[:limit]
    )
    resent = sum(1 for job_id in lost if dispatch.dispatch_job(job_id))
    return resent, timed_out
