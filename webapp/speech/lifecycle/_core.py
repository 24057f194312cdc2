"""The lifecycle's shared steps: change a job's state under its row lock, end it, settle it.

Private to the package (an import-linter contract): the public transitions in
``client``, ``worker``, ``beat`` and ``retention`` are the outer actions that call
these inside their own transactions.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from webapp.errors import JobFailureCode
from webapp.speech.models import JobStatus, SynthesisJob
from webapp.speech.services import dispatch, events, ledger, notify

log = logging.getLogger("webapp.speech.lifecycle")

Status = SynthesisJob.Status
TABLE = SynthesisJob._meta.db_table
ACTIVE = Q(status__in=SynthesisJob.ACTIVE)
RUNNING = Q(status=Status.RUNNING)
# A job whose answer a waiting client (/v1/audio/speech) takes is settled when that answer is
# handed to the client's connection, not when the job completes: until then it succeeded unsettled,
# its waiter's lease still held. A client gone before its answer was handed is charged what its
# stream handed, nothing for a whole file.
AWAITING_ANSWER = Q(status=Status.SUCCEEDED, waiter_until__isnull=False)
HELD = ACTIVE | AWAITING_ANSWER


def _transition(job_id: Any, allowed: Q, **changes: Any) -> SynthesisJob | None:
    """Lock the job if it matches ``allowed`` and apply ``changes``; None when it does not match."""
    job = (
        SynthesisJob.objects.select_for_update(of=("self",))
        .select_related("organization__plan")
        .filter(allowed, id=job_id)
        .first()
    )
    if job is None:
        return None
    for name, value in changes.items():
        setattr(job, name, value)
    job.save(update_fields=list(changes))
    notify.job_changed(job_id, job.status, job.progress)
    return job


def _settle_delivered(job: SynthesisJob) -> ledger.Settlement | None:
    """Settle a job that ends before its whole answer was handed: what its streams handed to clients."""
    return ledger.settle_delivery(job.id, int(job.delivered_chars), float(job.delivered_seconds))


def _ended(job: SynthesisJob, settlement: ledger.Settlement | None) -> None:
    """The one event of a job's end, in the transaction that ended it."""
    events.publish(events.JobEnded(job.id, str(job.status), settlement))


def _settled(job_id: Any, settlement: ledger.Settlement | None) -> None:
    """A settlement apart from the job's end (announced when it ended, or when it ends)."""
    if settlement is not None:
        events.publish(events.JobSettled(job_id, settlement))


def _end(job_id: Any, allowed: Q, status: JobStatus, **changes: Any) -> SynthesisJob | None:
    """Move an active job to an end state (failed, canceled) and settle it.

    Either charges what the job's streams delivered before it ended (a stream,
    then a cancel or a failure, is not audio for free), and releases the rest.
    """
    job = _transition(
        job_id,
        allowed,
        status=status,
        stage=str(status),
        finished_at=Now(),  # the database clock, as completion's (text retention is judged by it)
        lease_until=None,
        **changes,
    )
    if job is not None:
        _ended(job, _settle_delivered(job))
    return job


def _cancel(job_id: Any, allowed: Q = ACTIVE) -> SynthesisJob | None:
    return _end(job_id, allowed, Status.CANCELED, cancel_requested=True)


def _fail(job_id: Any, code: JobFailureCode, message: str, allowed: Q = ACTIVE) -> SynthesisJob | None:
    job = _end(job_id, allowed, Status.FAILED, error_code=str(code), error_message=message[:1000])
    if job is not None:
        log.info("job %s failed: %s %s", job_id, code, message)
    return job


def _requeue(job_id: Any, allowed: Q, reason: str, **changes: Any) -> bool:
    job = _transition(
        job_id,
        allowed,
        status=Status.QUEUED,
        lease_until=None,
        worker="",
        progress=0.0,
        stage=str(Status.QUEUED),
        dispatched_at=None,
        **changes,
    )
    if job is None:
        return False
    transaction.on_commit(lambda: dispatch.dispatch_job(job_id), robust=True)
    log.info("job %s re-queued: %s", job_id, reason)
    return True


def _job_uuid(job_id: Any) -> uuid.UUID:
    return job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))


def _current(token: int) -> Q:
    """The job as long as the attempt holding ``token`` owns it."""
    return Q(status=Status.RUNNING, claim_token=token)
