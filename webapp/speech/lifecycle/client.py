"""The client's side of a job: submit, cancel, delete, and the waiting client's answer.

``submit_job`` creates a queued job with its reservation under the tenant lock;
``cancel_job``, ``delete_job`` and ``abandon_job`` end it early, charged what its
streams handed. A transport (an HTTP stream, the OpenAI answer) reports through
one call, ``report_handed``: what it handed one client (``ledger.Handed``) and
whether the answer goes on (``record_delivery``), was taken whole
(``answer_handed``: settled as a completion) or was left (``abandon_job``);
``renew_waiter`` keeps a waiting client's lease; ``abandon_lapsed_waiters``
(beat) settles a job whose client vanished. Each public function is an outer action.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest, Now
from django.utils import timezone

from webapp.audit.context import current_request_id
from webapp.errors import DomainError, ErrorCode, JobFailureCode
from webapp.speech.lifecycle._core import (
    ACTIVE,
    AWAITING_ANSWER,
    HELD,
    RUNNING,
    Status,
    _cancel,
    _fail,
    _settle_delivered,
    _settled,
    _transition,
)
from webapp.speech.lifecycle.retention import expire_audio
from webapp.speech.models import IdempotencyKey, SynthesisJob, Voice, VoiceConsent
from webapp.speech.services import dispatch, files, ledger, prompts
from webapp.speech.services.pins import NO_PINS, DictionaryPins
from webapp.tenants import locks
from webapp.tenants.models import ApiKey, Organization

log = logging.getLogger("webapp.speech.lifecycle")


@dataclass(frozen=True)
class JobRequest:
    text: str
    voice: Voice
    format: str
    sample_rate: int | None
    params: dict[str, Any]
    billable_chars: int
    source: str = "api"
    # The pronunciation dictionary versions the job pins (resolved by webapp.speech.submission).
    dictionaries: DictionaryPins = field(default=NO_PINS)
    waited: bool = False  # a client waits on the job's answer and holds its waiter lease
    use_cache: bool = True  # the tenant's sentence cache serves and keeps this job's sentences
    webhook_url: str = ""  # this job's job.* events are sent here too (webapp/webhooks)
    # Characters the engine will be given (the text after its dictionaries; None: the billable
    # ones): its time limits are sized on them.
    synth_chars: int | None = None
    # The built-in voice that speaks ``voice`` when it is another one chosen at submit: a zero_shot
    # voice's, of the model the request named or one that clones (services.prompts.speaking_voice).
    speaker: Voice | None = None
    # ``speaker`` is the zero_shot voice's closest built-in voice, standing in for a clone that is
    # not possible now (the request's ``voice_fallback: closest``): the job is ``approximate``.
    closest_fallback: bool = False
    # The realtime session this job is a unit of (None: a job of its own).
    session_id: Any = None
    lane: str = "batch"  # SynthesisJob.Lane: interactive work is claimed first


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
    work = request.synth_chars or request.billable_chars  # what the engine will synthesise
    with transaction.atomic(durable=True):
        org = locks.lock_tenant(organization.pk)
        if idempotency_key is not None:
            existing = _claim_idempotency_key(org, idempotency_key, fingerprint or "", now)
            if existing is not None:
                return existing, False
        period = ledger.check_limits(org, request.billable_chars, now, request.voice.engine)
        voice_name, engine, params, mode = prompts.job_voice(
            request.voice, request.params, now, request.speaker, approximate=request.closest_fallback
        )
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
            dictionaries=request.dictionaries.record,
            source=request.source,
            request_id=current_request_id(),
            retry_of=retry_of,
            session_id=request.session_id,
            lane=request.lane,
            use_cache=request.use_cache,
            webhook_url=request.webhook_url,
            created_at=now,
            queued_at=now,
            synth_chars=request.synth_chars,
            time_limit=dt.timedelta(seconds=dispatch.job_time_limits(work)[1]),
            # A job made for a client that waits on it (/v1/audio/speech) starts with the lease
            # that client renews (renew_waiter): if its web process is killed before the first
            # renewal, the reaper still abandons the job.
            waiter_until=now + dt.timedelta(seconds=settings.TTS_WAITER_LEASE_SECONDS)
            if request.waited
            else None,
        )
        pins = request.dictionaries
        if pins.versions:
            # Under the tenant lock a dictionary delete takes too: still there now, pinned from here on.
            pins.confirm()
        job.save(force_insert=True)
        if pins.versions:
            job.pinned_dictionary_versions.set(pins.versions)
        ledger.reserve_usage(job, period)
        if idempotency_key is not None:
            IdempotencyKey.objects.filter(organization=org, key=idempotency_key).update(job=job)
        job_id, engine, chars = job.id, job.engine, work
        # Robust: the submit is committed; a failing dispatch is logged, beat sends it again,
        # and the client gets its job (not a 500 for a job that exists).
        transaction.on_commit(lambda: dispatch.dispatch_job(job_id, engine, chars), robust=True)
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


class Handing(StrEnum):
    """Where a client's answer stands when its transport reports what it handed."""

    GOING = "going"  # more to come: the marks a later cancel, delete or disconnect charges
    WHOLE = "whole"  # the waiting client took its whole answer: settled as a completion
    LEFT = "left"  # the client went away before the end: settled as what it was handed


def report_handed(
    job_id: Any,
    handed: ledger.Handed | None = None,
    *,
    handing: Handing = Handing.GOING,
    renew_waiter: bool = False,
) -> None:
    """The one call a transport makes about what it handed one client of a job: ``handed``
    (its bytes and sentences; the ledger says what they are worth) and where the answer stands.

    ``renew_waiter``: the client is the job's waiter (/v1/audio/speech), whose lease
    this renews too.
    """
    chars, seconds = ledger.delivered(handed) if handed is not None else (0, 0.0)
    if handing == Handing.WHOLE:
        answer_handed(job_id, chars, seconds)
    elif handing == Handing.LEFT:
        _abandon_job(job_id, chars, seconds)
    else:
        record_delivery(job_id, chars, seconds, hold_waiter=renew_waiter)


def abandon_job(job: SynthesisJob, delivered_chars: int = 0, delivered_seconds: float = 0.0) -> None:
    """A synchronous caller gave up waiting, or went away: cancel the job and settle it now.

    Charged: what the job's streams handed to clients (``delivered_*``: this
    caller's stream, recorded first; the most any stream delivered counts),
    nothing for an answer never sent. A running job stops at its next sentence;
    it is settled already, and ``complete_job`` ends it canceled, so whatever
    the worker does later charges nothing more. A job that succeeded while its
    waiter's answer was still being handed is settled the same way (``_leave_answer``).
    """
    _abandon_job(job.id, delivered_chars, delivered_seconds)


def _abandon_job(job_id: Any, delivered_chars: int, delivered_seconds: float) -> None:
    with transaction.atomic(durable=True):
        _record_delivery(job_id, delivered_chars, delivered_seconds)
        _abandon(job_id, ACTIVE) or _leave_answer(job_id, AWAITING_ANSWER)


def _abandon(job_id: Any, allowed: Q) -> bool:
    if _cancel(job_id, Q(status=Status.QUEUED) & allowed) is not None:
        return True
    # The lease goes with it: the reaper does not come back to a job already abandoned.
    locked = _transition(job_id, RUNNING & allowed, cancel_requested=True, waiter_until=None)
    if locked is None:
        return False
    _settled(locked.id, _settle_delivered(locked))  # its end is announced when the worker stops
    return True


def _record_delivery(job_id: Any, chars: int, seconds: float) -> None:
    """Raise the job's delivered high-water marks to (``chars``, ``seconds``); never lower them.

    The most any one stream handed out, not a sum: a client that reconnects and
    hears the same sentences again pays for them once.
    """
    if chars <= 0 and seconds <= 0:
        return
    SynthesisJob.objects.filter(id=job_id).update(
        delivered_chars=Greatest(F("delivered_chars"), Value(int(chars))),
        delivered_seconds=Greatest(F("delivered_seconds"), Value(float(seconds))),
    )


def record_delivery(job_id: Any, chars: int, seconds: float, *, hold_waiter: bool = False) -> None:
    """A stream handed these sentences (characters, audio seconds) to its client so far.

    ``hold_waiter``: the stream's client is the job's waiter (/v1/audio/speech),
    whose lease this renews too. Not a change of state: the marks a later
    cancel, delete or disconnect charges (``_settle_delivered``).
    """
    with transaction.atomic(durable=True):
        _record_delivery(job_id, chars, seconds)
        if hold_waiter:
            _renew_waiter(job_id)


def renew_waiter(job_id: Any) -> bool:
    """The waiting client is still connected: its lease on the job runs TTS_WAITER_LEASE_SECONDS more.

    False when the job is no longer held (ended, or settled by its answer).
    """
    with transaction.atomic(durable=True):
        return _renew_waiter(job_id)


def renew_session_waiters(session_id: Any) -> int:
    """The session's socket is still open: every unit it holds keeps its waiter lease (one statement
    for all of them, not one per unit); returns how many it holds."""
    lease = dt.timedelta(seconds=settings.TTS_WAITER_LEASE_SECONDS)
    with transaction.atomic(durable=True):
        return SynthesisJob.objects.filter(HELD, session_id=session_id).update(waiter_until=Now() + lease)


def _renew_waiter(job_id: Any) -> bool:
    lease = dt.timedelta(seconds=settings.TTS_WAITER_LEASE_SECONDS)
    return bool(SynthesisJob.objects.filter(HELD, id=job_id).update(waiter_until=Now() + lease))


def abandon_lapsed_waiters(limit: int = 500) -> int:
    """Abandon active jobs whose waiting client's lease lapsed (its web process died without a word).

    A web process killed outright (after gunicorn's graceful_timeout) runs no
    code: its waiters' jobs would run to the end and be charged for answers
    no one receives. Charged as any abandon: what streams delivered.
    """
    lapsed = Q(waiter_until__lt=Now())
    # HELD & lapsed, said as speech_job_held_idx's condition is (a lapsed lease is a lease held), so
    # that PostgreSQL reads that index of a handful of rows, not the history.
    held_and_lapsed = Q(
        status__in=[Status.QUEUED, Status.RUNNING, Status.SUCCEEDED], waiter_until__isnull=False
    )
    ids = list(
        SynthesisJob.objects.filter(held_and_lapsed & lapsed)
        .order_by("waiter_until")
        .values_list("id", flat=True)[:limit]
    )
    abandoned = 0
    for job_id in ids:
        with transaction.atomic(durable=True):
            abandoned += _abandon(job_id, lapsed) or _leave_answer(job_id, lapsed)
        log.info("job %s abandoned: its waiting client's lease lapsed", job_id)
    return abandoned


def delete_job(job: SynthesisJob) -> None:
    """Delete a job and its audio; an active job is canceled first so its reservation is released."""
    with transaction.atomic(durable=True):
        _cancel(job.id)
        locked = SynthesisJob.objects.select_for_update().filter(id=job.id).first()
        if locked is None:
            return
        ledger.release(locked.id)  # no-op when already settled
        path = locked.audio_path
        locked.delete()
        transaction.on_commit(lambda: files.remove_file(path))


def fail_jobs_of_deleted_voice(voice: Voice) -> int:
    """A step of a voice's deletion, inside its transaction: the voice's queued jobs end ``voice_deleted``.

    The one transition that joins its caller's transaction: the voice row is
    locked and deleted there, so no job can be queued for it in between.
    """
    queued = Q(status=Status.QUEUED)
    failed = 0
    for job_id in SynthesisJob.objects.filter(queued, voice=voice).values_list("id", flat=True):
        if _fail(
            job_id, JobFailureCode.VOICE_DELETED, "The voice this job used was deleted.", allowed=queued
        ):
            failed += 1
    return failed


def fail_jobs_of_revoked_consent(consent: VoiceConsent) -> int:
    """A step of a consent's revocation, inside its transaction: the queued and running jobs that clone
    a voice under it end ``consent_revoked``. A running one's attempt finds its job ended at its next
    sentence's fenced write and stops there; what its streams delivered is charged.
    """
    cloning = SynthesisJob.objects.filter(ACTIVE, voice__consent=consent, cloning_mode=prompts.ZERO_SHOT)
    failed = 0
    for job_id in cloning.values_list("id", flat=True):
        if _fail(
            job_id, JobFailureCode.CONSENT_REVOKED, "The consent of the voice this job clones was revoked."
        ):
            failed += 1
    return failed


def answer_handed(job_id: Any, chars: int = 0, seconds: float = 0.0) -> bool:
    """The waiting client's answer was handed to its connection (a whole file's first block, or a
    stream's last, which hands ``chars`` and ``seconds`` in all): the job is settled as a completion.
    False when it was settled already."""
    with transaction.atomic(durable=True):
        _record_delivery(job_id, chars, seconds)  # the stream's marks reach its end, as its client did
        job = _transition(job_id, AWAITING_ANSWER, waiter_until=None)
        if job is None:
            return False
        settlement = ledger.settle_completion(
            job.id,
            float(job.duration_seconds or 0),
            characters=job.text_chars,
            cached=job.cached_characters,
            cached_price=float(job.organization.plan.cached_character_price),
        )
        _settled(job.id, settlement)  # job.succeeded went when it was published
        return True


def _leave_answer(job_id: Any, allowed: Q) -> bool:
    """The waiting client of a succeeded job went away before its whole answer was handed: charged
    what its stream handed (nothing for a whole file), and the audio removed at once, so that a
    replay of the request (its Idempotency-Key) cannot fetch what was not paid for."""
    job = _transition(job_id, AWAITING_ANSWER & allowed, waiter_until=None)
    if job is None:
        return False
    _settled(job.id, _settle_delivered(job))
    transaction.on_commit(lambda: expire_audio(job_id, immediately=True), robust=True)
    return True
