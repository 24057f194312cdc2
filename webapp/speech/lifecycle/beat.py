"""Beat's side of a job: the reaper, the lapsed waiters and the queue's time limit.

``reap_running`` ends or re-queues running jobs no live attempt is moving (each
decided under its row lock, by the database clock); ``fail_queue_timeouts`` ends
jobs queued past TTS_JOB_MAX_QUEUE_SECONDS. Re-sending a lost message is not a
change of state and asks the broker: webapp/housekeeping/synthesis.py does it.
Each public function is an outer action.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.utils import timezone

from webapp.errors import JobFailureCode
from webapp.speech import owners
from webapp.speech.lifecycle._core import Status, _cancel, _current, _end, _fail, _requeue
from webapp.speech.lifecycle.client import abandon_lapsed_waiters
from webapp.speech.models import SynthesisJob
from webapp.speech.services import outputs


def _stalled_since() -> Any:
    return Now() - dt.timedelta(seconds=settings.TTS_JOB_STALL_SECONDS)


def reap_running(limit: int = 500) -> dict[str, int]:
    """End or re-queue running jobs no live attempt is moving, each decided under its row lock.

    Past the deadline or stalled (no progress for TTS_JOB_STALL_SECONDS):
    ``timeout``, released, not retried. Lease expired: re-queued, or
    ``worker_lost`` once the attempts are spent. All times by ``now()``.
    """
    counts = {"requeued": 0, "failed": 0, "timeout": 0, "canceled": 0}
    counts["abandoned"] = abandon_lapsed_waiters(limit)
    due = Q(lease_until__lt=Now()) | Q(deadline__lt=Now()) | Q(progress_at__lt=_stalled_since())
    ids = list(
        SynthesisJob.objects.filter(due, status=Status.RUNNING)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    for job_id in ids:
        with transaction.atomic(durable=True):
            outcome = _reap_one(job_id)
        if outcome in counts:
            counts[outcome] += 1
    return counts


def _is(condition: Q) -> ExpressionWrapper:
    return ExpressionWrapper(condition, output_field=BooleanField())


def _reap_one(job_id: Any) -> str:
    # Locked first, then judged with the database clock: a lease renewed meanwhile counts.
    job = (
        SynthesisJob.objects.select_for_update()
        .filter(id=job_id, status=Status.RUNNING)
        .annotate(
            past_deadline=_is(Q(deadline__lt=Now())),
            stalled=_is(Q(progress_at__lt=_stalled_since())),
            expired=_is(Q(lease_until__lt=Now())),
        )
        .first()
    )
    if job is None:
        return "skipped"
    outcome = _reap_locked(job, float(settings.TTS_JOB_STALL_SECONDS))
    if outcome != "skipped":
        _discard_if_owner_dead(job)
    return outcome


def _reap_locked(job: Any, stall: float) -> str:
    mine = _current(job.claim_token)
    if job.past_deadline or job.stalled:
        why = "ran past its time limit" if job.past_deadline else f"made no progress for {stall:g} s"
        _fail(job.id, JobFailureCode.TIMEOUT, f"The job {why} and was stopped.", mine)
        return "timeout"
    if not job.expired:
        return "skipped"
    if job.cancel_requested:
        _cancel(job.id, mine)
        return "canceled"
    if job.attempts >= settings.TTS_JOB_MAX_ATTEMPTS:
        _fail(
            job.id,
            JobFailureCode.WORKER_LOST,
            f"The worker running this job was lost {job.attempts} times.",
            mine,
        )
        return "failed"
    return "requeued" if _requeue(job.id, mine, "lease expired", queued_at=timezone.now()) else "skipped"


def _discard_if_owner_dead(job: SynthesisJob) -> None:
    """The released attempt's files go now when its owner is known dead (same host, pid gone).

    An owner that may be alive (elsewhere, or only paused) still owns its files:
    it removes them itself when it learns it lost, or the orphan sweep does.
    """
    if job.worker and owners.owner_is_local(job.worker) and owners.owner_is_dead(job.worker):
        outputs.discard_attempt(job, job.claim_token)


def requeue_expired_leases(limit: int = 500) -> tuple[int, int]:
    """(re-queued, failed) of one reaper pass; see :func:`reap_running`."""
    counts = reap_running(limit)
    return counts["requeued"], counts["failed"] + counts["timeout"]


def fail_queue_timeouts(limit: int = 500) -> int:
    """End jobs queued longer than TTS_JOB_MAX_QUEUE_SECONDS ``queue_timeout``, released; how many."""
    too_old = timezone.now() - dt.timedelta(seconds=settings.TTS_JOB_MAX_QUEUE_SECONDS)
    queued = Q(status=Status.QUEUED)
    expired = list(
        SynthesisJob.objects.filter(queued)
        .filter(Q(queued_at__lt=too_old) | Q(queued_at__isnull=True, created_at__lt=too_old))
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    message = f"No worker took the job within {settings.TTS_JOB_MAX_QUEUE_SECONDS} s."
    timed_out = 0
    for job_id in expired:
        with transaction.atomic(durable=True):
            ended = _end(
                job_id, queued, Status.FAILED, error_code=JobFailureCode.QUEUE_TIMEOUT, error_message=message
            )
            timed_out += ended is not None
    return timed_out
