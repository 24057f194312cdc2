"""The job state machine's client side: submit, cancel, abandon, delete, expire; and its transitions.

Every transition goes through :func:`_transition`: lock the row only if it is
in a state the transition allows, change it, save, and (for the end states)
settle the ledger in the same transaction. A transition whose row no longer
matches (finished meanwhile, re-claimed by another worker) does nothing and
says so, so redeliveries and races are harmless.

Public functions are actions: each opens the outermost transaction
(``durable=True``) and never calls another action. The worker side (claims,
fenced progress and results, the reaper, lost deliveries) is in
:mod:`webapp.speech.services.attempts`, built on the same transitions, except
the three writes every job makes (its claim, its progress and its completion),
which are one ``UPDATE ... RETURNING`` each there, with the same rule: the row
changes only if it is still in a state the write allows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from webapp import rawrows
from webapp.audit.context import current_request_id
from webapp.errors import DomainError, ErrorCode
from webapp.speech.models import IdempotencyKey, SynthesisJob, Voice
from webapp.speech.services import dispatch, files, ledger, notify, prompts
from webapp.tenants.models import ApiKey, Organization

log = logging.getLogger(__name__)

Status = SynthesisJob.Status
ACTIVE = Q(status__in=SynthesisJob.ACTIVE)
RUNNING = Q(status=Status.RUNNING)


# --------------------------------------------------------------------- transitions


def _transition(job_id: Any, allowed: Q, **changes: Any) -> SynthesisJob | None:
    """Lock the job if it matches ``allowed`` and apply ``changes``; None when it does not match.

    A change given as a function is called with the locked job (for a value that
    depends on it, such as its plan's retention), so it goes in the same UPDATE.
    """
    job = (
        SynthesisJob.objects.select_for_update(of=("self",))
        .select_related("organization__plan")
        .filter(allowed, id=job_id)
        .first()
    )
    if job is None:
        return None
    for name, value in changes.items():
        setattr(job, name, value(job) if callable(value) else value)
    job.save(update_fields=list(changes))
    notify.job_changed(job_id, job.status, job.progress)
    return job


def _end(job_id: Any, allowed: Q, status: Status, **changes: Any) -> SynthesisJob | None:
    """Move an active job to an end state (failed, canceled) and release its reservation."""
    job = _transition(
        job_id,
        allowed,
        status=status,
        stage=str(status),
        finished_at=timezone.now(),
        lease_until=None,
        **changes,
    )
    if job is not None:
        ledger.release_usage(job)
    return job


def _cancel(job_id: Any, allowed: Q = ACTIVE) -> SynthesisJob | None:
    return _end(job_id, allowed, Status.CANCELED, cancel_requested=True)


def _fail(job_id: Any, code: str, message: str, allowed: Q = ACTIVE) -> SynthesisJob | None:
    job = _end(job_id, allowed, Status.FAILED, error_code=code, error_message=message[:1000])
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
        stage="queued",
        dispatched_at=None,
        **changes,
    )
    if job is None:
        return False
    transaction.on_commit(lambda: dispatch.dispatch_job(job_id))
    log.info("job %s re-queued: %s", job_id, reason)
    return True


# --------------------------------------------------------------------- submit


@dataclass(frozen=True)
class JobRequest:
    text: str
    voice: Voice
    format: str
    sample_rate: int | None
    params: dict[str, Any]
    billable_chars: int
    source: str = "api"


def request_fingerprint(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _check_same_request(row: IdempotencyKey, fingerprint: str) -> None:
    """One Idempotency-Key, one request body: a different body under it is refused."""
    if row.request_hash != fingerprint:
        raise DomainError(
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            "This Idempotency-Key was already used with a different request body.",
            field="Idempotency-Key",
        )


def _claim_idempotency_key(
    org: Organization, key: str, fingerprint: str, now: dt.datetime
) -> SynthesisJob | None:
    cutoff = now - dt.timedelta(hours=settings.TTS_IDEMPOTENCY_TTL_HOURS)
    IdempotencyKey.objects.filter(organization=org, key=key, created_at__lt=cutoff).delete()
    # The tenant row lock held by the caller serialises submits of one tenant,
    # so a plain lookup-then-insert cannot race here.
    row = IdempotencyKey.objects.filter(organization=org, key=key).select_related("job").first()
    if row is None:
        IdempotencyKey.objects.create(organization=org, key=key, request_hash=fingerprint, created_at=now)
        return None
    _check_same_request(row, fingerprint)
    if row.job is None:
        raise DomainError(
            ErrorCode.IDEMPOTENCY_KEY_IN_USE, "A request with this Idempotency-Key is in progress."
        )
    return row.job


def idempotent_replay(organization: Organization, key: str, fingerprint: str) -> SynthesisJob | None:
    """The job an earlier request with this Idempotency-Key created, if it is still live.

    Lets a retry get its job back before anything else is checked (a retry
    must not fail because, say, no worker is up right now).
    """
    cutoff = timezone.now() - dt.timedelta(hours=settings.TTS_IDEMPOTENCY_TTL_HOURS)
    row = (
        IdempotencyKey.objects.filter(organization=organization, key=key, created_at__gte=cutoff)
        .select_related("job")
        .first()
    )
    if row is None:
        return None
    _check_same_request(row, fingerprint)
    return row.job


def submit_job(
    organization: Organization,
    request: JobRequest,
    *,
    api_key: ApiKey | None = None,
    user: Any = None,
    idempotency_key: str | None = None,
    fingerprint: str | None = None,
    retry_of: SynthesisJob | None = None,
) -> tuple[SynthesisJob, bool]:
    """Create a queued job with its usage reservation. Returns (job, created).

    The tenant row is locked first, so the concurrency count and the monthly
    quota are exact under any number of parallel submits. The engine's
    queue depth is checked without a lock: a limit, not a count to the job.
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        org = ledger.lock_tenant(organization.pk)
        if idempotency_key is not None:
            existing = _claim_idempotency_key(org, idempotency_key, fingerprint or "", now)
            if existing is not None:
                return existing, False
        period = ledger.check_limits(org, request.billable_chars, now, request.voice.engine)
        voice_name, engine, params, mode = prompts.job_voice(request.voice, request.params, now)
        job = SynthesisJob(
            organization=org,
            api_key=api_key,
            user=user if getattr(user, "is_authenticated", False) else None,
            voice=request.voice,
            voice_name=voice_name,
            engine=engine,
            cloning_mode=mode,
            text=request.text,
            text_chars=request.billable_chars,
            format=request.format,
            sample_rate=request.sample_rate,
            params=params,
            source=request.source,
            request_id=current_request_id(),
            retry_of=retry_of,
            created_at=now,
            queued_at=now,
        )
        rawrows.insert(job)  # every submit: the statement is written once, not compiled each time
        ledger.reserve_usage(job, period)
        if idempotency_key is not None:
            IdempotencyKey.objects.filter(organization=org, key=idempotency_key).update(job=job)
        job_id, engine, chars = job.id, job.engine, job.text_chars
        transaction.on_commit(lambda: dispatch.dispatch_job(job_id, engine, chars))
    return job, True


# --------------------------------------------------------------------- client side


def cancel_job(job: SynthesisJob) -> SynthesisJob:
    """Cancel a queued job at once; ask a running one to stop at its next sentence."""
    with transaction.atomic(durable=True):
        if _cancel(job.id, Q(status=Status.QUEUED)) is None:
            locked = _transition(job.id, RUNNING, cancel_requested=True)
            if locked is None:
                status = SynthesisJob.objects.filter(id=job.id).values_list("status", flat=True).get()
                if status != Status.CANCELED:
                    raise DomainError(
                        ErrorCode.JOB_FINISHED, f"The job is already {status}; nothing to cancel."
                    )
    return SynthesisJob.objects.get(id=job.id)


def abandon_job(job: SynthesisJob, charge_characters: int = 0) -> None:
    """A synchronous caller gave up waiting: cancel the job and give its characters back now.

    A running job stops at its next sentence; its release is already written,
    and ``complete_job`` ends it canceled, so whatever the worker does later
    charges nothing. ``charge_characters``: a streaming client that left had
    heard that much; it is charged and only the rest given back.
    """
    with transaction.atomic(durable=True):
        if _cancel(job.id, Q(status=Status.QUEUED)) is None:
            locked = _transition(job.id, RUNNING, cancel_requested=True)
            if locked is not None:
                ledger.charge_part(locked, charge_characters)


def delete_job(job: SynthesisJob) -> None:
    """Delete a job and its audio; an active job is canceled first so its reservation is released."""
    with transaction.atomic(durable=True):
        _cancel(job.id)
        locked = SynthesisJob.objects.select_for_update().filter(id=job.id).first()
        if locked is None:
            return
        ledger.release_usage(locked)  # no-op when already settled
        path = locked.audio_path
        locked.delete()
        transaction.on_commit(lambda: files.remove_file(path))


# --------------------------------------------------------------------- housekeeping


def expire_audio(job_id: Any, *, immediately: bool = False) -> int:
    """Remove a finished job's audio past retention (``immediately``: now) and mark it expired.

    Returns bytes freed.
    """
    due = Q(status=Status.SUCCEEDED)
    if not immediately:
        due &= Q(expires_at__lte=timezone.now())
    with transaction.atomic(durable=True):
        row = (
            SynthesisJob.objects.select_for_update()
            .filter(due, id=job_id)
            .values("audio_path", "audio_bytes")
        )
        before = row.first()
        if before is None:
            return 0
        _transition(job_id, due, status=Status.EXPIRED, audio_path="", audio_bytes=0)
    # After the commit: a file is never gone while a committed row still points at it.
    freed = files.remove_file(before["audio_path"])
    return freed or int(before["audio_bytes"])
