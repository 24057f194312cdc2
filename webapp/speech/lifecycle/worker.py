"""The worker's side of a job: claim it, report progress, complete, fail or hand it back.

A claim takes a fencing token; every later write of the attempt matches only the
current claim (``status='running' AND claim_token=<token>``), so a paused or
partitioned attempt whose job was handed on changes nothing. The three writes
every job makes (its claim, its progress and its completion) are one conditional
``UPDATE`` each; the one statement written by hand is the fair pick
(``FOR UPDATE SKIP LOCKED`` ordered by the tenant's running jobs). Each public
function is an outer action.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import (
    BigIntegerField,
    Case,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Extract, Greatest, Now
from django.utils import timezone

from webapp.errors import JobFailureCode
from webapp.rawrows import fetch_one
from webapp.speech.lifecycle._core import (
    TABLE,
    Status,
    _cancel,
    _current,
    _fail,
    _job_uuid,
    _requeue,
)
from webapp.speech.models import ClaimProtocol, JobTimestamps, SynthesisJob, sql_status_in
from webapp.speech.services import events, ledger, notify
from webapp.tenants.models import Organization

log = logging.getLogger("webapp.speech.lifecycle")

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


# --------------------------------------------------------------------- claims


def _next_token() -> Any:
    """The next fencing token: above the last, and never below the database clock in microseconds.

    A claim whose COMMIT a failover lost (asynchronous replica promoted) left an owner that
    still holds its token; counting on from the replica's row would hand the next claimer that
    same token, and with it the same file names and writes. The clock has moved on since, so
    the token the next claim gets is one no earlier claim held.
    """
    micros = Cast(Extract(Now(), "epoch") * Value(1_000_000), BigIntegerField())
    return Greatest(F("claim_token") + 1, micros)


def _claim_changes(worker_id: str) -> dict[str, Any]:
    """What every claim sets: the next fencing token, the owner, the lease and the deadline.

    The deadline is the job's own hard limit (``time_limit``, set at submit from
    ``dispatch.job_time_limits``) from now, by the database clock.
    """
    now = Now()
    return {
        "status": Status.RUNNING,
        "claim_token": _next_token(),
        "attempts": F("attempts") + 1,
        "worker": worker_id,
        "stage": "loading voice",
        "progress": 0.0,
        "lease_until": now + dt.timedelta(seconds=settings.TTS_JOB_LEASE_SECONDS),
        "deadline": now + Coalesce(F("time_limit"), Value(_default_time_limit(), DurationField())),
        "progress_at": now,
        "started_at": Coalesce(F("started_at"), now),
    }


def _default_time_limit() -> dt.timedelta:
    """The hard limit of a row from before ``time_limit`` existed: the longest any job gets."""
    return dt.timedelta(seconds=settings.TTS_MAX_JOB_SECONDS + settings.TTS_JOB_HARD_GRACE_SECONDS)


def _claim(job_id: Any, claimable: Q, worker_id: str) -> SynthesisJob | None:
    """Inside the caller's transaction: take job ``job_id`` if it is ``claimable``, and read it back."""
    if not SynthesisJob.objects.filter(claimable, id=job_id).update(**_claim_changes(worker_id)):
        return None
    # Our UPDATE holds the row's lock until commit: the read sees the claim just made.
    job = SynthesisJob.objects.get(id=job_id)
    notify.job_changed(job.id, job.status, job.progress)
    return job


def claim_job(
    job_id: Any,
    worker_id: str,
    dead_workers: tuple[str, ...] | list[str] = (),
    *,
    suspect: str = "",
) -> SynthesisJob | None:
    """Take this job: queued, or running under an owner that is gone.

    ``dead_workers``: owners known dead (their pid is gone on this host), taken
    at once. ``suspect``: an owner elsewhere whose heartbeat is missing, taken
    only once its lease has expired by the database clock. A dead owner's job
    past its deadline is not taken again: it ends ``timeout``.
    """
    dead = [w for w in dead_workers if w]
    owner_gone = Q(worker__in=dead) if dead else Q(pk__in=[])
    if suspect:
        owner_gone |= Q(worker=suspect, lease_until__lt=Now())
    in_time = Q(deadline__isnull=True) | Q(deadline__gt=Now())
    claimable = Q(cancel_requested=False, attempts__lt=settings.TTS_JOB_MAX_ATTEMPTS) & (
        Q(status=Status.QUEUED) | (Q(status=Status.RUNNING) & in_time & owner_gone)
    )
    with transaction.atomic(durable=True):
        job = _claim(_job_uuid(job_id), claimable, worker_id)
    if job is None:
        close_unclaimable(job_id, dead)
    return job


# The fair pick: interactive work first (a client waits on it now), then the queued job of the
# engine whose tenant runs the fewest jobs, then the one whose tenant was served least recently
# (its latest success of the engine within FAIR_RECENT_SECONDS, read from the partial index the
# ETA uses), then the oldest; SKIP LOCKED, so concurrent claimers take different jobs instead of
# waiting. The recency turn matters when jobs run one at a time (a batch share of one slot):
# every tenant then runs none at each claim, and without it a burst queued first would be served
# whole before another tenant's one job. Each message claims one job whatever its lane, so the
# messages of an engine's queue still match its queued jobs one for one (dispatch.resend_lost).
FAIR_RECENT_SECONDS = 600
_FAIREST_QUEUED = f"""
    WITH running AS (
        SELECT organization_id, count(*) AS n FROM {TABLE}
        WHERE {sql_status_in((Status.RUNNING,))} GROUP BY organization_id
    ), served AS (
        SELECT organization_id, max(finished_at) AS at FROM {TABLE}
        WHERE {sql_status_in((Status.SUCCEEDED,))} AND engine = %(engine)s
          AND finished_at > now() - interval '{FAIR_RECENT_SECONDS} seconds'
        GROUP BY organization_id
    )
    SELECT j.id FROM {TABLE} j
      LEFT JOIN running r ON r.organization_id = j.organization_id
      LEFT JOIN served s ON s.organization_id = j.organization_id
    WHERE {sql_status_in((Status.QUEUED,), "j.status")} AND j.engine = %(engine)s
      AND NOT j.cancel_requested AND j.attempts < %(attempts)s
      AND (j.lane = '{SynthesisJob.Lane.INTERACTIVE}' OR %(batch_open)s)
    ORDER BY j.lane = '{SynthesisJob.Lane.INTERACTIVE}' DESC, COALESCE(r.n, 0), s.at NULLS FIRST,
      j.created_at, j.id
    LIMIT 1 FOR UPDATE OF j SKIP LOCKED"""


# pg_advisory_xact_lock(class, hashtext(engine)): one claimer of an engine at a time counts its
# running batch jobs and claims, while a cap on them is in force.
_BATCH_CAP_LOCK = 0x6C61_6E65  # "lane"


def batch_running(engine: str) -> int:
    return SynthesisJob.objects.filter(
        status=Status.RUNNING, engine=engine, lane=SynthesisJob.Lane.BATCH
    ).count()


def claim_next(engine: str, worker_id: str, batch_slots: int | None = None) -> SynthesisJob | None:
    """Take the fairest queued job of ``engine``: interactive before batch, then the tenant running
    the fewest jobs, then the tenant served least recently, then the oldest. ``batch_slots``: at most this many batch jobs of the engine
    may run at once, on all its workers (services/lanes.py); None: no cap."""
    with transaction.atomic(durable=True):
        batch_open = True
        if batch_slots is not None:
            fetch_one("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_BATCH_CAP_LOCK, engine])
            batch_open = batch_running(engine) < batch_slots
        row = fetch_one(
            _FAIREST_QUEUED,
            {"engine": engine, "attempts": settings.TTS_JOB_MAX_ATTEMPTS, "batch_open": batch_open},
        )
        if row is None:
            return None
        return _claim(row[0], Q(status=Status.QUEUED), worker_id)


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
            _fail(job_id, JobFailureCode.TIMEOUT, "The job ran past its time limit and was stopped.", gone)
        elif row[0] >= settings.TTS_JOB_MAX_ATTEMPTS:
            attempts = row[0]
            _fail(
                job_id,
                JobFailureCode.WORKER_LOST,
                f"The job stopped its worker {attempts} times; giving up.",
                gone,
            )


def _past_deadline(job_id: Any) -> bool:
    return SynthesisJob.objects.filter(id=job_id, deadline__lt=Now()).exists()


# --------------------------------------------------------------------- fenced writes


def report_progress(job_id: Any, token: int, done: int, total: int, stage: str | None = None) -> Verdict:
    """Record progress and renew the lease while this attempt owns the job; say whether to go on."""
    progress = 0.0 if total <= 0 else min(1.0, done / total)
    mine = SynthesisJob.objects.filter(_current(token), id=job_id)
    now = Now()
    moved = mine.update(
        stage=(stage or f"synthesising {min(done + 1, total)}/{total}")[:100],
        lease_until=now + dt.timedelta(seconds=settings.TTS_JOB_LEASE_SECONDS),
        # The stall clock restarts only when the job advanced.
        progress_at=Case(When(progress__lt=progress, then=now), default=F("progress_at")),
        progress=progress,
    )
    if not moved:
        return Verdict.LOST
    canceled = mine.values_list("cancel_requested", flat=True).first()
    notify.job_changed(job_id, Status.RUNNING, progress)
    if canceled is None:
        return Verdict.LOST  # ended between the two statements
    return Verdict.CANCEL if canceled else Verdict.GO


def complete_job(
    job_id: Any,
    token: int,
    *,
    audio_path: str,
    audio_bytes: int,
    duration_seconds: float,
    metrics: dict[str, Any],
    applied_instructions: dict[str, Any],
    cached_characters: int = 0,
    timestamps: dict[str, Any] | None = None,
    awaited: bool = False,
) -> bool:
    """Publish this attempt's file as the job's audio and charge it, exactly once.

    ``cached_characters``: of its sentences, those served from the sentence cache (charged at
    the plan's cached_character_price).

    ``timestamps`` (synth's ``{"words", "sentences"}``) are published with it, in this transaction.

    ``awaited``: the claimed row had a waiting client (an OpenAI request), so the statement for a
    job with a waiter is tried first; a wrong guess (the client left or came meanwhile) costs one more.

    Under the row lock and only for the current token: the row then names the
    winning attempt's own file. A cancel requested meanwhile ends the job
    canceled instead, nothing charged; False tells the worker its file is not
    the job's audio.
    """
    # The database clock: the expiry is judged by other hosts, whose clocks may differ from ours.
    now = Now()
    stamps = None if timestamps is None else (timestamps.get("words", []), timestamps.get("sentences", []))
    retention = Subquery(
        Organization.objects.filter(id=OuterRef("organization_id")).values("plan__retention_days")
    )
    with transaction.atomic(durable=True):
        outcome: dict[str, Any] = dict(
            status=Status.SUCCEEDED,
            progress=1.0,
            stage="done",
            finished_at=now,
            lease_until=None,
            audio_path=audio_path,
            audio_bytes=audio_bytes,
            duration_seconds=duration_seconds,
            metrics=metrics,
            applied_instructions=applied_instructions,
            cached_characters=max(0, int(cached_characters)),
            # What the stored rows take, as JSON: counted in the tenant's storage.
            timestamps_bytes=0 if stamps is None else len(json.dumps(stamps).encode()),
            expires_at=ExpressionWrapper(
                now + ExpressionWrapper(retention * dt.timedelta(days=1), DurationField()),
                output_field=DateTimeField(),
            ),
        )
        # One statement: the row lock, the check that this attempt still owns the job and no
        # cancel was asked for, and the expiry from the tenant's plan. A job without a waiting client
        # is settled here; one with (its lease held) by its answer.
        published = settle_now = False
        for waiting in (True, False) if awaited else (False, True):
            published = bool(
                SynthesisJob.objects.filter(
                    _current(token), id=job_id, cancel_requested=False, waiter_until__isnull=not waiting
                ).update(**outcome)
            )
            if published:
                settle_now = not waiting
                break
        if not published:
            # Taken over (a no-op here), or a cancel was asked for meanwhile: then it ends canceled.
            _cancel(job_id, _current(token) & Q(cancel_requested=True))
            return False
        if stamps is not None:
            # One INSERT ... ON CONFLICT: a row left by an earlier publish of this job is replaced.
            row = JobTimestamps(job_id=job_id, words=stamps[0], sentences=stamps[1])
            JobTimestamps.objects.bulk_create(
                [row], update_conflicts=True, unique_fields=["job"], update_fields=["words", "sentences"]
            )
        notify.job_changed(job_id, Status.SUCCEEDED, 1.0)
        settlement = _settle_completion(job_id, duration_seconds, cached_characters) if settle_now else None
        events.publish(events.JobEnded(job_id, Status.SUCCEEDED, settlement))
    return True


def _settle_completion(job_id: Any, duration_seconds: float, cached: int) -> ledger.Settlement | None:
    """A completion's settlement; the row is read again only for a job the cache served (its
    characters and its plan's price for cached ones)."""
    if not cached:
        return ledger.settle_completion(job_id, duration_seconds)
    row = (
        SynthesisJob.objects.filter(id=job_id)
        .values_list("text_chars", "organization__plan__cached_character_price")
        .first()
    )
    if row is None:
        return ledger.settle_completion(job_id, duration_seconds)
    return ledger.settle_completion(
        job_id, duration_seconds, characters=int(row[0]), cached=cached, cached_price=float(row[1])
    )


def fail_job(job_id: Any, code: JobFailureCode, message: str, token: int | None = None) -> bool:
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
