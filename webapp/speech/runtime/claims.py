"""The claim policy: which job a message's delivery takes.

A message is a wake-up. Its delivery re-claims the message's own job when
that job's owner is gone (dead here by its pid: at once; elsewhere with its
heartbeat missing: once its lease has expired by the database clock), else
takes the fairest queued job of the message's engine (``lifecycle.claim_next``:
interactive work first, then the tenant with the fewest running jobs, then the
oldest), batch jobs only while the engine's batch share of children is not full
(``services.lanes``). A job that no one may claim (spent, canceled) is closed so
it never stays open.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings

from webapp.speech import lifecycle, owners
from webapp.speech.models import SynthesisJob
from webapp.speech.runtime import worker
from webapp.speech.runtime.attempt import DB_ERRORS, db_retry
from webapp.speech.services import lanes
from webapp.speech.services.dispatch import job_time_limits
from webapp.speech.services.outputs import discard_attempt

log = logging.getLogger(__name__)


def _discard_dead_attempt(job_id: Any, token: int) -> None:
    """Remove the files of attempt ``token``, whose owner this message saw dead.

    Only that token: a rival that claimed the job first (token + 1) is alive and
    writing its own files, and a later token never belongs to the dead owner.
    """
    try:
        job = SynthesisJob.objects.filter(id=job_id).only("organization_id", "format").first()
    except DB_ERRORS:
        return  # the orphan sweep removes them
    if job is not None:
        discard_attempt(job, token)


def _unreported_claim(state: worker.WorkerState) -> SynthesisJob | None:
    """A job this child claimed whose reply never came (the COMMIT went through, its answer was lost).

    The row names this child as owner, and no attempt of this child runs it:
    the claim just retried made it. Without this the job sat "running" under a
    live owner, with no one working on it, until its lease ran out (60-90 s).
    """
    return (
        SynthesisJob.objects.filter(status=SynthesisJob.Status.RUNNING, worker=state.worker_id)
        .exclude(id__in=list(state.attempts))
        .order_by("-claim_token")
        .first()
    )


def _claimed(
    state: worker.WorkerState, claim: Callable[..., SynthesisJob | None], *args: Any
) -> SynthesisJob | None:
    """``claim(*args)`` through ``db_retry``; a retry takes the claim a lost reply made first.

    The job claimed is registered with the child's attempts at once, so that a
    later claim's retry (a batching child claims several) never takes it again.
    """
    tries = [0]

    def once() -> SynthesisJob | None:
        tries[0] += 1
        job = _unreported_claim(state) if tries[0] > 1 else None
        if job is not None:
            log.warning("job %s: its claim's reply was lost; the claim stands", job.id)
        else:
            job = claim(*args)
        if job is not None:
            state.attempts[str(job.id)] = int(job.claim_token)
        return job

    return db_retry(once)


def _owner_gone(owner: str, me: str) -> tuple[list[str], str]:
    """(dead, suspect) for a running job's owner: dead here by its pid, a suspect elsewhere."""
    if not owner or not owners.owner_is_dead(owner, me):
        return [], ""
    # Elsewhere a missing heartbeat only makes the owner a suspect: its lease must have run out too.
    local = owner == me or owners.owner_is_local(owner)
    return ([owner], "") if local else ([], owner)


def _message_job(job_id: str) -> tuple[str, str, str, int, str] | None:
    """(status, owner, engine, token, lane) of the message's job, read together; None when it was deleted."""
    return (
        SynthesisJob.objects.filter(id=job_id)
        .values_list("status", "worker", "engine", "claim_token", "lane")
        .first()
    )


def _claim(state: worker.WorkerState, job_id: str) -> SynthesisJob | None:
    """The message's job if its owner is gone, else the fairest queued job of the message's engine.

    The message's engine, not every engine this child serves: a wake-up for one
    engine must not use up the message another engine's job is waiting for.
    """
    me = state.worker_id
    row = db_retry(_message_job, job_id)
    if row is None:
        return None  # deleted meanwhile
    status, owner, engine, seen_token, lane = row
    dead, suspect = _owner_gone(owner if status == SynthesisJob.Status.RUNNING else "", me)
    if dead or suspect:
        job = _claimed(state, functools.partial(lifecycle.claim_job, suspect=suspect), job_id, me, dead)
        if dead:
            # The dead owner ran no cleanup: the files of the token it held when we read
            # its row are ours to remove, whoever claimed the job since (never theirs).
            _discard_dead_attempt(job_id, seen_token)
        if job is not None:
            return job
    job = None
    if engine in settings.TTS_WORKER_ENGINES:
        slots = lanes.batch_slots(engine)
        job = _claimed(state, lifecycle.claim_next, engine, me, slots)
        if job is None and status == SynthesisJob.Status.QUEUED:
            if lane == SynthesisJob.Lane.BATCH and slots is not None and _batch_full(engine, slots):
                # The batch share is full: this message is spent, and the next batch job's end
                # passes a wake-up on (lanes.pass_on).
                lanes.note_refused(engine)
            else:
                # SKIP LOCKED passes over a row locked for a moment, such as this very job's
                # dispatch marking it sent just after publishing this message. With nothing
                # else queued, dropping the message would leave the job without one until
                # the lost-delivery sweep: wait for that lock and take the job instead.
                job = _claimed(state, lifecycle.claim_job, job_id, me)
    if job is None or str(job.id) != str(job_id):
        # The message's job may be one no one can claim (spent, canceled): it must not stay open.
        db_retry(lifecycle.close_unclaimable, job_id)
    return job


def _batch_full(engine: str, slots: int) -> bool:
    return bool(db_retry(lifecycle.batch_running, engine) >= slots)


def ended(job: SynthesisJob) -> None:
    """A claimed job's attempt is over: a batch job frees a batch slot, which a refused message may want."""
    if job.lane != SynthesisJob.Lane.BATCH or settings.TTS_WORKER_INTERACTIVE_RESERVED <= 0:
        return
    try:
        lanes.pass_on(job.engine)
    except DB_ERRORS as exc:
        log.warning("job %s: no wake-up passed on (the sweep re-sends what the queue lacks): %s", job.id, exc)


def claim_for_message(
    state: worker.WorkerState, job_id: str, limits: list[float] | None
) -> tuple[SynthesisJob, tuple[float, float]] | None:
    """The job this message claims (see ``_claim``) and its (soft, hard) limits; None: nothing to run.

    ``limits``: the (soft, hard) limits the message carries for its own job.
    """
    job = _claim(state, job_id)
    if job is None:
        return None
    return job, limits_of(job, limits if str(job.id) == str(job_id) else None)


def claim_next(state: worker.WorkerState, engine: str) -> SynthesisJob | None:
    """The fairest queued job of ``engine`` for this child (a batching child's further claims)."""
    return _claimed(state, lifecycle.claim_next, engine, state.worker_id, lanes.batch_slots(engine))


def limits_of(job: SynthesisJob, sent: list[float] | None = None) -> tuple[float, float]:
    """(soft, hard) seconds of a claimed job.

    ``sent``: the limits its own message carries, computed where it was submitted;
    a job claimed through another job's message gets its soft limit from its
    length here. The hard limit is the row's, which the claim's deadline counts from.
    """
    soft, hard = (
        (float(sent[0]), float(sent[1]))
        if sent and len(sent) == 2
        else job_time_limits(job.synth_chars or job.text_chars)
    )
    if job.time_limit is not None:
        hard = job.time_limit.total_seconds()
    return soft, hard
