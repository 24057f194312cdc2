"""The job lifecycle: every change of a job's state, each a public transition.

Client side: ``submit_job``, ``cancel_job``, ``abandon_job``, ``delete_job``,
``expire_audio``. Worker side: ``claim_job``/``claim_next`` (the claim takes a
fencing token), ``report_progress`` (renews the lease), ``complete_job``,
``fail_job``, ``requeue_job``, ``finish_canceled``, ``close_unclaimable``.
Beat: ``reap_running`` (expired leases, stalls, deadlines, lapsed waiters), ``resend_lost_deliveries``,
``blank_old_texts`` (text retention).

Each public transition is an outer action (``transaction.atomic(durable=True)``)
that never calls another; the worker-side ones match only the current claim
(``status='running' AND claim_token=<token>``), so a paused or partitioned
attempt whose job was handed on changes nothing. Shared steps are private here:
:func:`_transition` locks the row only if it is in a state the transition allows
and changes it; every end goes through :func:`_settle`, the one settlement of the
job's reservation (charge what was delivered, release the rest). Nothing outside
this module writes a job's ``status`` (tests/unit/test_lifecycle_writes.py).
Leases, deadlines and progress times come from the database clock (``now()``).

The three writes every job makes (its claim, its progress and its completion)
are one conditional ``UPDATE`` each, with the same rule: the row changes only
if it is still in a state the write allows. They are the ORM's; the one
statement written by hand is the fair pick (``FOR UPDATE SKIP LOCKED`` ordered
by the tenant's running jobs), whose status values come from the enum
(``models.sql_status_in``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Case,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Extract, Greatest, Now
from django.urls import reverse
from django.utils import timezone

from webapp.audit.context import current_request_id
from webapp.dictionaries import services as dictionary_services
from webapp.errors import DomainError, ErrorCode, JobFailureCode
from webapp.rawrows import fetch_one
from webapp.speech import owners
from webapp.speech.models import (
    ClaimProtocol,
    IdempotencyKey,
    JobStatus,
    JobTimestamps,
    SynthesisJob,
    UsageEvent,
    UsagePeriod,
    Voice,
    sql_status_in,
)
from webapp.speech.services import dispatch, files, ledger, notify, outputs, prompts
from webapp.speech.services.ledger import Part, PartKind
from webapp.tenants.models import ApiKey, Organization, Plan
from webapp.webhooks import outbox

log = logging.getLogger(__name__)

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


def _settle(job_id: Any, parts: tuple[Part, ...] = ()) -> bool:
    """The one settlement of a job, inside the transition that ends it: charge ``parts``, release the rest.

    Every way a job ends comes here: a completion charges its characters fresh
    (and its audio past the bound per character), a cancel, delete or a client
    that left charges what streams handed to clients (:func:`_delivered`), a
    failure nothing. The ledger takes one settlement per job; a second is a no-op.
    """
    return ledger.settle(job_id, parts)


# What a job's webhooks need, in one statement: the job, the tenant's enabled endpoints, and the
# month's usage where the job was charged (for usage.threshold). Read once the transition settled it.
_WEBHOOK_FACTS = f"""
    SELECT j.organization_id, j.status, j.voice_name, j.format, j.text_chars, j.webhook_url,
        j.duration_seconds, j.error_code, j.error_message, {outbox.endpoints_sql("j.organization_id")},
        u.period, u.characters_used, p.monthly_characters
    FROM {TABLE} j
    JOIN {Organization._meta.db_table} o ON o.id = j.organization_id
    JOIN {Plan._meta.db_table} p ON p.id = o.plan_id
    LEFT JOIN {UsageEvent._meta.db_table} c ON c.job_key = j.id AND c.kind = '{UsageEvent.Kind.CHARGE}'
    LEFT JOIN {UsagePeriod._meta.db_table} u ON u.organization_id = c.organization_id AND u.period = c.period
    WHERE j.id = %s"""


def _announce(job_id: Any, *, ended: bool = True) -> None:
    """In the transaction that ended (``ended``) or settled the job: its job.* event to the tenant's
    endpoints and its own webhook_url, and usage.threshold once its charge reached 80 % or 100 % of
    the month's characters. Nothing more than the one read when no endpoint or URL wants them."""
    row = fetch_one(_WEBHOOK_FACTS, [job_id])
    if row is None:
        return
    org, status, voice, fmt, chars, url, seconds, code, message, endpoints_json, period, used, monthly = row
    endpoints = outbox.endpoints_from(endpoints_json)
    if used is not None:
        outbox.record_usage(org, period, int(used), int(monthly), endpoints=endpoints)
    if not ended:
        return
    origin = settings.TTS_PUBLIC_ORIGIN
    data: dict[str, Any] = {
        "id": str(job_id),
        "status": str(status),
        "voice": voice,
        "format": fmt,
        "text_chars": chars,
        "url": origin + reverse("api-speech-detail", args=[job_id]),
    }
    if status == Status.SUCCEEDED:
        data["audio_url"] = origin + reverse("api-speech-audio", args=[job_id])
        data["duration_seconds"] = seconds
    if status == Status.FAILED:
        data["error"] = {"code": code, "message": message}
    outbox.record(org, f"job.{status}", data, subject=str(job_id), job_url=url, endpoints=endpoints)


def _completed(
    duration_seconds: float, cached: int = 0, characters: int = 0, price: float = 1.0
) -> tuple[Part, ...]:
    """A completion's charge: the whole text, and audio past the bound per character by its seconds.

    Of a job that found ``cached`` of its ``characters`` in the sentence cache, those are
    charged at the plan's ``price`` for them, the rest fresh.
    """
    audio = ledger.audio_seconds_part(duration_seconds)
    cached = min(max(0, cached), characters)
    if not cached:
        return (Part(PartKind.FRESH), audio)
    return (Part(PartKind.FRESH, characters - cached), ledger.cached_part(cached, price), audio)


def _completed_job(job_id: Any, duration_seconds: float) -> tuple[Part, ...]:
    """:func:`_completed` for a job's row: its characters, those from the cache, its plan's price."""
    row = (
        SynthesisJob.objects.filter(id=job_id)
        .values_list("text_chars", "cached_characters", "organization__plan__cached_character_price")
        .first()
    )
    if row is None:
        return _completed(duration_seconds)
    return _completed(duration_seconds, int(row[1]), int(row[0]), float(row[2]))


def _delivered(job: SynthesisJob) -> tuple[Part, ...]:
    """What the job's streams handed to clients: its sentences' characters, and audio past the bound."""
    return (
        Part(PartKind.DELIVERED, int(job.delivered_chars)),
        ledger.audio_seconds_part(float(job.delivered_seconds)),
    )


def _end(job_id: Any, allowed: Q, status: JobStatus, **changes: Any) -> SynthesisJob | None:
    """Move an active job to an end state (failed, canceled) and settle it.

    A cancel charges what the job's streams delivered (a stream, then a cancel,
    is not audio for free); a failure charges nothing.
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
        _settle(job.id, _delivered(job) if status == Status.CANCELED else ())
        _announce(job.id)
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
    # The pronunciation dictionary versions the job pins (webapp.dictionaries.services.resolve).
    dictionaries: list[Any] = field(default_factory=list)
    waited: bool = False  # a client waits on the job's answer and holds its waiter lease
    use_cache: bool = True  # the tenant's sentence cache serves and keeps this job's sentences
    webhook_url: str = ""  # this job's job.* events are sent here too (webapp/webhooks)


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
            dictionaries=dictionary_services.pin_record(request.dictionaries),
            source=request.source,
            request_id=current_request_id(),
            retry_of=retry_of,
            use_cache=request.use_cache,
            webhook_url=request.webhook_url,
            created_at=now,
            queued_at=now,
            time_limit=dt.timedelta(seconds=dispatch.job_time_limits(request.billable_chars)[1]),
            # A job made for a client that waits on it (/v1/audio/speech) starts with the lease
            # that client renews (renew_waiter): if its web process is killed before the first
            # renewal, the reaper still abandons the job.
            waiter_until=now + dt.timedelta(seconds=settings.TTS_WAITER_LEASE_SECONDS)
            if request.waited
            else None,
        )
        if request.dictionaries:
            # Under the tenant lock a dictionary delete takes too: still there now, pinned from here on.
            dictionary_services.require_present(request.dictionaries)
        job.save(force_insert=True)
        if request.dictionaries:
            job.pinned_dictionary_versions.set(request.dictionaries)
        ledger.reserve_usage(job, period)
        if idempotency_key is not None:
            IdempotencyKey.objects.filter(organization=org, key=idempotency_key).update(job=job)
        job_id, engine, chars = job.id, job.engine, job.text_chars
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


def abandon_job(job: SynthesisJob, delivered_chars: int = 0, delivered_seconds: float = 0.0) -> None:
    """A synchronous caller gave up waiting, or went away: cancel the job and settle it now.

    Charged: what the job's streams handed to clients (``delivered_*``: this
    caller's stream, recorded first; the most any stream delivered counts),
    nothing for an answer never sent. A running job stops at its next sentence;
    it is settled already, and ``complete_job`` ends it canceled, so whatever
    the worker does later charges nothing more. A job that succeeded while its
    waiter's answer was still being handed is settled the same way (``_leave_answer``).
    """
    with transaction.atomic(durable=True):
        _record_delivery(job.id, delivered_chars, delivered_seconds)
        _abandon(job.id, ACTIVE) or _leave_answer(job.id, AWAITING_ANSWER)


def _abandon(job_id: Any, allowed: Q) -> bool:
    if _cancel(job_id, Q(status=Status.QUEUED) & allowed) is not None:
        return True
    # The lease goes with it: the reaper does not come back to a job already abandoned.
    locked = _transition(job_id, RUNNING & allowed, cancel_requested=True, waiter_until=None)
    if locked is None:
        return False
    if _settle(locked.id, _delivered(locked)):
        _announce(locked.id, ended=False)  # the end is announced when the worker stops
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
    cancel, delete or disconnect charges (:func:`_delivered`).
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
    ids = list(
        SynthesisJob.objects.filter(HELD & lapsed)
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
        _settle(locked.id)  # no-op when already settled
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
        JobTimestamps.objects.filter(job_id=job_id).delete()  # they describe the audio: gone with it
    # After the commit: a file is never gone while a committed row still points at it.
    freed = files.remove_file(before["audio_path"])
    return freed or int(before["audio_bytes"])


def blank_old_texts(limit: int = 500) -> int:
    """Blank the text (and instructions) of finished jobs past their plan's text retention; returns how many.

    The text is the tenant's content and goes; the row stays, with what history
    and usage need (key, voice, source, characters, times, status). Judged by the
    database clock: ``finished_at`` is set by it. Only the text changes, and only
    on finished jobs (a queued or running job still needs its text), so this
    never races a state change: each UPDATE re-checks the job is finished.
    """
    retention = ExpressionWrapper(
        F("organization__plan__text_retention_days") * dt.timedelta(days=1), output_field=DurationField()
    )
    due = (
        SynthesisJob.objects.filter(
            status__in=SynthesisJob.FINISHED,
            organization__plan__text_retention_days__isnull=False,
            finished_at__lt=Now() - retention,
        )
        .exclude(text="")
        .order_by("finished_at", "id")
    )
    ids = list(due.values_list("id", flat=True)[:limit])
    if not ids:
        return 0
    with transaction.atomic(durable=True):
        rows = SynthesisJob.objects.filter(id__in=ids, status__in=SynthesisJob.FINISHED).exclude(text="")
        # The instructions are the tenant's own words too, and what could not be applied of them
        # quotes them ("unrecognised instruction: ..."): they go with the text.
        worded = list(rows.filter(params__has_key="instructions").only("id", "params"))
        for job in worded:
            job.params = {name: value for name, value in job.params.items() if name != "instructions"}
        SynthesisJob.objects.bulk_update(worded, ["params"])
        return rows.update(text="", applied_instructions={})


# ===================================================================== worker side

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


# The fair pick: the queued job of the engine whose tenant runs the fewest jobs, then the
# oldest; SKIP LOCKED, so concurrent claimers take different jobs instead of waiting.
_FAIREST_QUEUED = f"""
    WITH running AS (
        SELECT organization_id, count(*) AS n FROM {TABLE}
        WHERE {sql_status_in((Status.RUNNING,))} GROUP BY organization_id
    )
    SELECT j.id FROM {TABLE} j LEFT JOIN running r ON r.organization_id = j.organization_id
    WHERE {sql_status_in((Status.QUEUED,), "j.status")} AND j.engine = %s AND NOT j.cancel_requested AND j.attempts < %s
    ORDER BY COALESCE(r.n, 0), j.created_at, j.id
    LIMIT 1 FOR UPDATE OF j SKIP LOCKED"""


def claim_next(engine: str, worker_id: str) -> SynthesisJob | None:
    """Take the fairest queued job of ``engine``: the tenant running the fewest jobs, then the oldest."""
    with transaction.atomic(durable=True):
        row = fetch_one(_FAIREST_QUEUED, [engine, settings.TTS_JOB_MAX_ATTEMPTS])
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


def _current(token: int) -> Q:
    return Q(status=Status.RUNNING, claim_token=token)


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
        if timestamps is not None:
            # One INSERT ... ON CONFLICT: a row left by an earlier publish of this job is replaced.
            row = JobTimestamps(
                job_id=job_id, words=timestamps.get("words", []), sentences=timestamps.get("sentences", [])
            )
            JobTimestamps.objects.bulk_create(
                [row], update_conflicts=True, unique_fields=["job"], update_fields=["words", "sentences"]
            )
        notify.job_changed(job_id, Status.SUCCEEDED, 1.0)
        if settle_now:
            # The row is read again only for a job the cache served (its plan's price).
            parts = _completed_job(job_id, duration_seconds) if cached_characters else None
            _settle(job_id, parts or _completed(duration_seconds))
        _announce(job_id)
    return True


def answer_handed(job_id: Any) -> bool:
    """The waiting client's answer was handed to its connection (a whole file's first block, or a
    stream's last): the job is settled as a completion. False when it was settled already."""
    with transaction.atomic(durable=True):
        job = _transition(job_id, AWAITING_ANSWER, waiter_until=None)
        if job is None:
            return False
        price = float(job.organization.plan.cached_character_price)
        seconds = float(job.duration_seconds or 0)
        if _settle(job.id, _completed(seconds, job.cached_characters, job.text_chars, price)):
            _announce(job.id, ended=False)  # job.succeeded went when it was published
        return True


def _leave_answer(job_id: Any, allowed: Q) -> bool:
    """The waiting client of a succeeded job went away before its whole answer was handed: charged
    what its stream handed (nothing for a whole file), and the audio removed at once, so that a
    replay of the request (its Idempotency-Key) cannot fetch what was not paid for."""
    job = _transition(job_id, AWAITING_ANSWER & allowed, waiter_until=None)
    if job is None:
        return False
    if _settle(job.id, _delivered(job)):
        _announce(job.id, ended=False)
    transaction.on_commit(lambda: expire_audio(job_id, immediately=True), robust=True)
    return True


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


# --------------------------------------------------------------------- reaper


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


# --------------------------------------------------------------------- lost deliveries


def resend_lost_deliveries(limit: int = 500) -> tuple[int, int]:
    """(re-sent, timed out): queued jobs whose message was lost, and jobs queued too long.

    A message is a wake-up for its engine's queue (any waiting message claims
    one queued job of the engine), so a message is lost only where the queue
    holds fewer messages than the engine has dispatched queued jobs: that many
    jobs, those dispatched longest ago (more than TTS_JOB_REDELIVER_SECONDS,
    ``dispatched_at`` then moves on), get theirs again. The broker is asked, not
    a marker of ours: a purge, a Redis restarted without its last writes, a
    worker that died holding a message all show as a shorter queue, and a
    backlog with no worker keeps one message per job, never more. A duplicate
    (a message a worker holds but has not claimed with yet) is harmless: the
    claim is conditional. One queued longer than TTS_JOB_MAX_QUEUE_SECONDS
    ends ``queue_timeout`` and is released.
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
                    error_code=JobFailureCode.QUEUE_TIMEOUT,
                    error_message=message,
                )
                is not None
            )
    resent = sum(1 for job_id in _lost_deliveries(queued, now, limit) if dispatch.dispatch_job(job_id))
    return resent, timed_out


def _lost_deliveries(queued: QuerySet[SynthesisJob], now: dt.datetime, limit: int) -> list[uuid.UUID]:
    """The queued jobs to send again: per engine, as many as its queue lacks messages."""
    cutoff = now - dt.timedelta(seconds=settings.TTS_JOB_REDELIVER_SECONDS)
    dispatched = queued.filter(dispatched_at__isnull=False)
    lost: list[uuid.UUID] = []
    per_engine = dispatched.values_list("engine").annotate(jobs=Count("id")).order_by("engine")
    for engine, jobs in per_engine:
        waiting = dispatch.messages_waiting(engine)
        missing = 0 if waiting is None else min(jobs - waiting, limit - len(lost))
        if missing > 0:
            lost += (
                dispatched.filter(engine=engine, dispatched_at__lt=cutoff)
                .order_by("dispatched_at")
                .values_list("id", flat=True)[:missing]
            )
    return lost
