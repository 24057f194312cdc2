"""Every state change of voices, jobs and usage, each inside a transaction.

Views parse and authorise, tasks are thin; both call these functions. The job
row is the outbox: a job is created ``queued`` with ``dispatched_at`` null,
the Celery message is sent after commit, and beat re-sends what was never sent.

Usage ledger: ``reserve`` at submit (same transaction as the job), then exactly
one of ``charge`` (success) or ``release`` (failure, cancel, expiry). The
``UsageEvent`` unique constraint on (job, kind) makes a second charge or
release impossible, whatever retries or redeliveries happen.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from webapp.problems import Problem
from webapp.speech import heartbeat
from webapp.speech.models import IdempotencyKey, SynthesisJob, UsageEvent, UsagePeriod, Voice
from webapp.tenants.models import ApiKey, Organization

if TYPE_CHECKING:
    from synth.registry import VoiceInfo

log = logging.getLogger(__name__)

Status = SynthesisJob.Status


# --------------------------------------------------------------------- periods


def period_start(when: dt.datetime | None = None) -> dt.date:
    """Usage periods are calendar months in UTC, derived from dates: no reset job."""
    when = (when or timezone.now()).astimezone(dt.UTC)
    return dt.date(when.year, when.month, 1)


def period_end(when: dt.datetime | None = None) -> dt.datetime:
    start = period_start(when)
    if start.month == 12:
        return dt.datetime(start.year + 1, 1, 1, tzinfo=dt.UTC)
    return dt.datetime(start.year, start.month + 1, 1, tzinfo=dt.UTC)


def seconds_to_period_end(when: dt.datetime | None = None) -> int:
    when = when or timezone.now()
    return max(1, int((period_end(when) - when).total_seconds()) + 1)


def queue_for_engine(engine: str) -> str:
    return f"synth.{engine}"


# --------------------------------------------------------------------- ledger


def _usage_row(organization_id: Any, period: dt.date) -> UsagePeriod:
    """The tenant's usage row for a period, locked for this transaction."""
    UsagePeriod.objects.get_or_create(organization_id=organization_id, period=period)
    return UsagePeriod.objects.select_for_update().get(organization_id=organization_id, period=period)


def _settle(job: SynthesisJob, kind: str) -> bool:
    """Charge or release the job's reservation exactly once. Returns False if already settled."""
    reserve = UsageEvent.objects.filter(job_key=job.id, kind=UsageEvent.Kind.RESERVE).first()
    if reserve is None:
        return False
    if UsageEvent.objects.filter(
        job_key=job.id, kind__in=[UsageEvent.Kind.CHARGE, UsageEvent.Kind.RELEASE]
    ).exists():
        return False
    try:
        with transaction.atomic():
            UsageEvent.objects.create(
                organization_id=job.organization_id,
                job=job,
                job_key=job.id,
                kind=kind,
                characters=reserve.characters,
                period=reserve.period,
            )
    except IntegrityError:
        return False
    row = _usage_row(job.organization_id, reserve.period)
    row.characters_reserved = F("characters_reserved") - reserve.characters
    if kind == UsageEvent.Kind.CHARGE:
        row.characters_used = F("characters_used") + reserve.characters
    row.save(update_fields=["characters_reserved", "characters_used"])
    return True


def charge_usage(job: SynthesisJob) -> bool:
    return _settle(job, UsageEvent.Kind.CHARGE)


def release_usage(job: SynthesisJob) -> bool:
    return _settle(job, UsageEvent.Kind.RELEASE)


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


def format_count(n: int) -> str:
    return f"{n:,}"


def _check_limits(organization: Organization, chars: int, now: dt.datetime) -> dt.date:
    """Concurrency and monthly quota, under row locks. Returns the period to reserve in."""
    plan = organization.plan
    if chars > plan.max_characters_per_request:
        raise Problem(
            413,
            "request_too_large",
            f"{format_count(chars)} characters in one request; your plan allows "
            f"{format_count(plan.max_characters_per_request)}.",
            field="text",
        )
    active = SynthesisJob.objects.filter(organization=organization, status__in=SynthesisJob.ACTIVE).count()
    if active >= plan.max_concurrent_jobs:
        raise Problem(
            429,
            "concurrency_limit",
            f"{active} of {plan.max_concurrent_jobs} concurrent jobs are queued or running; "
            "wait for one to finish.",
            retry_after=5,
        )
    used_bytes = storage_used(organization)
    if used_bytes >= plan.storage_bytes:
        raise Problem(
            429,
            "storage_limit",
            f"{format_count(used_bytes)} of {format_count(plan.storage_bytes)} bytes of storage are in use; "
            "delete old jobs or voices, or wait for audio to expire.",
            retry_after=3600,
        )
    period = period_start(now)
    row = _usage_row(organization.pk, period)
    total = row.characters_used + row.characters_reserved + chars
    if total > plan.monthly_characters:
        raise Problem(
            429,
            "quota_exceeded",
            f"{format_count(total)} of {format_count(plan.monthly_characters)} characters this month "
            f"({format_count(row.characters_used + row.characters_reserved)} used or reserved, "
            f"{format_count(chars)} requested).",
            retry_after=seconds_to_period_end(now),
        )
    return period


def submit_job(
    organization: Organization,
    request: JobRequest,
    *,
    api_key: ApiKey | None = None,
    user: Any = None,
    idempotency_key: str | None = None,
    fingerprint: str | None = None,
) -> tuple[SynthesisJob, bool]:
    """Create a queued job with its usage reservation. Returns (job, created).

    The tenant row is locked first, so the concurrency count and the monthly
    quota are exact under any number of parallel submits.
    """
    now = timezone.now()
    with transaction.atomic():
        # of=("self",): lock the tenant row only. Without it PostgreSQL also locks
        # the joined plan row, serialising every tenant on the same plan.
        org = (
            Organization.objects.select_for_update(of=("self",))
            .select_related("plan")
            .get(pk=organization.pk)
        )
        if idempotency_key is not None:
            existing = _claim_idempotency_key(org, idempotency_key, fingerprint or "", now)
            if existing is not None:
                return existing, False
        period = _check_limits(org, request.billable_chars, now)
        job = SynthesisJob.objects.create(
            organization=org,
            api_key=api_key,
            user=user if getattr(user, "is_authenticated", False) else None,
            voice=request.voice,
            voice_name=request.voice.voice_id,
            engine=request.voice.engine,
            text=request.text,
            text_chars=request.billable_chars,
            format=request.format,
            sample_rate=request.sample_rate,
            params=request.params,
            source=request.source,
            created_at=now,
        )
        UsageEvent.objects.create(
            organization=org,
            job=job,
            job_key=job.id,
            kind=UsageEvent.Kind.RESERVE,
            characters=request.billable_chars,
            period=period,
        )
        UsagePeriod.objects.filter(organization=org, period=period).update(
            characters_reserved=F("characters_reserved") + request.billable_chars
        )
        if idempotency_key is not None:
            IdempotencyKey.objects.filter(organization=org, key=idempotency_key).update(job=job)
        job_id = job.id
        transaction.on_commit(lambda: dispatch_job(job_id))
    return job, True


def _check_same_request(row: IdempotencyKey, fingerprint: str) -> None:
    """One Idempotency-Key, one request body: a different body under it is a 422."""
    if row.request_hash != fingerprint:
        raise Problem(
            422,
            "idempotency_key_reused",
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
        raise Problem(409, "idempotency_key_in_use", "A request with this Idempotency-Key is in progress.")
    return row.job


def dispatch_job(job_id: Any) -> bool:
    """Send the job's message to its engine queue and mark it dispatched.

    A failure to reach the broker is logged, not raised: the job stays
    undispatched and beat sends it again (``redispatch_undispatched``).
    """
    from webapp.speech.tasks import synthesize_job  # tasks import services

    job = (
        SynthesisJob.objects.filter(id=job_id, status=Status.QUEUED)
        .only("id", "engine", "text_chars")
        .first()
    )
    if job is None:
        return False
    # Limits travel with the message, so they scale with this job's text (SoftTimeLimitExceeded -> `timeout`).
    soft, hard = job_time_limits(job.text_chars)
    try:
        synthesize_job.apply_async(
            args=(str(job.id),),
            queue=queue_for_engine(job.engine),
            soft_time_limit=soft,
            time_limit=hard,
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.2},
        )
    except Exception as exc:  # kombu/redis errors have no common base worth naming
        log.warning("dispatch of job %s failed, beat will retry: %s", job_id, exc)
        return False
    SynthesisJob.objects.filter(id=job_id).update(dispatched_at=timezone.now())
    return True


def redispatch_undispatched(older_than_seconds: int | None = None, limit: int = 500) -> int:
    grace = settings.TTS_DISPATCH_GRACE_SECONDS if older_than_seconds is None else older_than_seconds
    cutoff = timezone.now() - dt.timedelta(seconds=grace)
    ids = list(
        SynthesisJob.objects.filter(status=Status.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    return sum(1 for job_id in ids if dispatch_job(job_id))


# --------------------------------------------------------------------- worker side


def job_time_limits(text_chars: int) -> tuple[int, int]:
    """(soft, hard) seconds for a job: grow with text length, capped by TTS_MAX_JOB_SECONDS."""
    soft = settings.TTS_JOB_BASE_SECONDS + settings.TTS_JOB_SECONDS_PER_CHAR * text_chars
    soft = min(soft, settings.TTS_MAX_JOB_SECONDS)
    hard = min(soft + 30, settings.TTS_MAX_JOB_SECONDS + 30)
    return int(soft), int(hard)


def claim_job(job_id: Any, worker_id: str, dead_workers: Iterable[str] = ()) -> SynthesisJob | None:
    """Atomically take a queued job (or a running one whose owner is dead).

    ``UPDATE ... WHERE status='queued'``: a redelivered or duplicate message
    finds nothing to claim. Returns the claimed job or None.
    """
    now = timezone.now()
    lease = now + dt.timedelta(seconds=settings.TTS_JOB_LEASE_SECONDS)
    claimable = Q(status=Status.QUEUED)
    dead = [w for w in dead_workers if w]
    if dead:
        claimable |= Q(status=Status.RUNNING, worker__in=dead)
    updated = SynthesisJob.objects.filter(
        claimable, id=job_id, cancel_requested=False, attempts__lt=settings.TTS_JOB_MAX_ATTEMPTS
    ).update(
        status=Status.RUNNING,
        lease_until=lease,
        attempts=F("attempts") + 1,
        worker=worker_id,
        started_at=Coalesce(F("started_at"), now),
        stage="loading voice",
        progress=0.0,
    )
    if updated:
        return SynthesisJob.objects.select_related("voice").get(id=job_id)
    # Not claimable: finish what must not stay open forever.
    job = SynthesisJob.objects.filter(id=job_id).first()
    if job is None or job.is_finished:
        return None
    if job.cancel_requested:
        finish_canceled(job.id)
    elif job.attempts >= settings.TTS_JOB_MAX_ATTEMPTS and (
        job.status == Status.QUEUED or job.worker in dead
    ):
        fail_job(job.id, "worker_lost", f"The job stopped its worker {job.attempts} times; giving up.")
    return None


def report_progress(job_id: Any, worker_id: str, done: int, total: int, stage: str | None = None) -> bool:
    """Record progress and renew the lease. Returns True when the job should stop (canceled or lost)."""
    lease = timezone.now() + dt.timedelta(seconds=settings.TTS_JOB_LEASE_SECONDS)
    progress = 0.0 if total <= 0 else min(1.0, done / total)
    # One round trip per sentence: write progress and read the cancel flag together.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {SynthesisJob._meta.db_table} SET progress = %s, stage = %s, lease_until = %s "
            "WHERE id = %s AND status = %s AND worker = %s RETURNING cancel_requested",
            [
                progress,
                (stage or f"synthesising {min(done + 1, total)}/{total}")[:100],
                lease,
                job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id)),
                Status.RUNNING.value,
                worker_id,
            ],
        )
        row = cursor.fetchone()
    if row is None:
        return True  # someone else owns it now, or it finished
    return bool(row[0])


def complete_job(
    job_id: Any,
    worker_id: str,
    *,
    audio_path: str,
    audio_bytes: int,
    duration_seconds: float,
    metrics: dict[str, Any],
    applied_instructions: dict[str, Any],
) -> bool:
    """Mark a job succeeded and charge it, exactly once."""
    now = timezone.now()
    with transaction.atomic():
        job = (
            SynthesisJob.objects.select_for_update()
            .select_related("organization__plan")
            .filter(id=job_id, status=Status.RUNNING, worker=worker_id)
            .first()
        )
        if job is None:
            return False
        job.status = Status.SUCCEEDED
        job.progress = 1.0
        job.stage = "done"
        job.finished_at = now
        job.lease_until = None
        job.audio_path = audio_path
        job.audio_bytes = audio_bytes
        job.duration_seconds = duration_seconds
        job.metrics = metrics
        job.applied_instructions = applied_instructions
        job.expires_at = now + dt.timedelta(days=job.organization.plan.retention_days)
        job.save()
        charge_usage(job)
    return True


def fail_job(job_id: Any, code: str, message: str, worker_id: str | None = None) -> bool:
    """Mark an active job failed and release its reservation."""
    with transaction.atomic():
        qs = SynthesisJob.objects.select_for_update().filter(id=job_id, status__in=SynthesisJob.ACTIVE)
        if worker_id is not None:
            qs = qs.filter(Q(worker=worker_id) | Q(status=Status.QUEUED))
        job = qs.first()
        if job is None:
            return False
        job.status = Status.FAILED
        job.error_code = code
        job.error_message = message[:1000]
        job.finished_at = timezone.now()
        job.lease_until = None
        job.stage = "failed"
        job.save()
        release_usage(job)
    log.info("job %s failed: %s %s", job_id, code, message)
    return True


def requeue_job(job_id: Any, worker_id: str | None = None, reason: str = "", oom: bool = False) -> bool:
    """Put a running job back in the queue (its worker died or ran out of memory).

    ``oom`` counts an out-of-memory retry (``oom_retries``), which is granted once.
    """
    with transaction.atomic():
        qs = SynthesisJob.objects.select_for_update().filter(id=job_id, status=Status.RUNNING)
        if worker_id is not None:
            qs = qs.filter(worker=worker_id)
        job = qs.first()
        if job is None:
            return False
        job.status = Status.QUEUED
        job.lease_until = None
        job.worker = ""
        job.progress = 0.0
        job.stage = "queued"
        job.dispatched_at = None
        if oom:
            job.oom_retries += 1
        job.save()
        transaction.on_commit(lambda: dispatch_job(job_id))
    log.info("job %s re-queued: %s", job_id, reason)
    return True


def finish_canceled(job_id: Any, worker_id: str | None = None) -> bool:
    """Mark an active job canceled and release its reservation.

    With ``worker_id`` (a worker that stopped at a cancel check) only while that
    worker still owns the job: a stop because the job was re-claimed elsewhere
    must not cancel the other run.
    """
    with transaction.atomic():
        qs = SynthesisJob.objects.select_for_update().filter(id=job_id, status__in=SynthesisJob.ACTIVE)
        if worker_id is not None:
            qs = qs.filter(worker=worker_id, cancel_requested=True)
        job = qs.first()
        if job is None:
            return False
        job.status = Status.CANCELED
        job.cancel_requested = True
        job.finished_at = timezone.now()
        job.lease_until = None
        job.stage = "canceled"
        job.save()
        release_usage(job)
    return True


def cancel_job(job: SynthesisJob) -> SynthesisJob:
    """Cancel a queued job at once; ask a running one to stop at its next sentence."""
    with transaction.atomic():
        locked = SynthesisJob.objects.select_for_update().get(id=job.id)
        if locked.status == Status.QUEUED:
            finish_canceled(locked.id)
        elif locked.status == Status.RUNNING:
            locked.cancel_requested = True
            locked.save(update_fields=["cancel_requested"])
        elif locked.status != Status.CANCELED:
            raise Problem(409, "job_finished", f"The job is already {locked.status}; nothing to cancel.")
    return SynthesisJob.objects.get(id=job.id)


def requeue_expired_leases(limit: int = 500) -> tuple[int, int]:
    """Running jobs whose lease ran out (worker or node died): re-queue, or fail when attempts are spent."""
    now = timezone.now()
    ids = list(
        SynthesisJob.objects.filter(status=Status.RUNNING, lease_until__lt=now).values_list("id", flat=True)[
            :limit
        ]
    )
    requeued = failed = 0
    for job_id in ids:
        job = SynthesisJob.objects.filter(id=job_id, status=Status.RUNNING, lease_until__lt=now).first()
        if job is None:
            continue
        if job.cancel_requested:
            finish_canceled(job_id)
        elif job.attempts >= settings.TTS_JOB_MAX_ATTEMPTS:
            failed += fail_job(
                job_id, "worker_lost", f"The worker running this job was lost {job.attempts} times."
            )
        else:
            requeued += requeue_job(job_id, reason="lease expired")
    return requeued, failed


# --------------------------------------------------------------------- files


def audio_abspath(relative: str) -> str:
    return os.path.join(str(settings.MEDIA_ROOT), relative)


def _remove_file(relative: str) -> int:
    if not relative:
        return 0
    path = audio_abspath(relative)
    try:
        size = os.path.getsize(path)
        os.unlink(path)
        return size
    except FileNotFoundError:
        return 0


def delete_job(job: SynthesisJob) -> None:
    """Delete a job and its audio; an active job is canceled first so its reservation is released."""
    with transaction.atomic():
        locked = SynthesisJob.objects.select_for_update().get(id=job.id)
        if locked.status in SynthesisJob.ACTIVE:
            finish_canceled(locked.id)
        release_usage(locked)  # no-op when already settled
        path = locked.audio_path
        locked.delete()
        transaction.on_commit(lambda: _remove_file(path))


def expire_audio(job_id: Any) -> int:
    """Remove a finished job's audio past retention and mark it expired. Returns bytes freed."""
    with transaction.atomic():
        job = (
            SynthesisJob.objects.select_for_update()
            .filter(id=job_id, status=Status.SUCCEEDED, expires_at__lte=timezone.now())
            .first()
        )
        if job is None:
            return 0
        path, size = job.audio_path, job.audio_bytes
        job.status = Status.EXPIRED
        job.audio_path = ""
        job.audio_bytes = 0
        job.save(update_fields=["status", "audio_path", "audio_bytes"])
    freed = _remove_file(path)
    return freed or size


def storage_used(organization: Organization) -> int:
    jobs = SynthesisJob.objects.filter(organization=organization).aggregate(n=Sum("audio_bytes"))["n"] or 0
    voices = Voice.objects.filter(organization=organization).aggregate(n=Sum("prompt_bytes"))["n"] or 0
    return int(jobs) + int(voices)


# --------------------------------------------------------------------- voices


def sync_builtin_voices(voices: Iterable[VoiceInfo]) -> int:
    """Upsert the built-in voices a worker serves (they carry no tenant)."""
    count = 0
    for info in voices:
        Voice.objects.update_or_create(
            voice_id=info.id,
            defaults={
                "organization": None,
                "name": info.name,
                "engine": info.engine,
                "language": info.language,
                "sample_rate": info.sample_rate,
                "capabilities": info.capabilities,
                "status": Voice.Status.READY,
            },
        )
        count += 1
    return count


# --------------------------------------------------------------------- API helpers (issue 4/5)

# Seconds of synthesis per billable character when an engine has no history yet
# (Piper on 2 CPU cores runs near 0.004 s/char; this errs on the slow side).
DEFAULT_SECONDS_PER_CHAR = 0.01
ETA_SAMPLE_JOBS = 20
# Recent successes one ETA reads (one query): room for ETA_SAMPLE_JOBS on a few devices.
ETA_SCAN_JOBS = 100


def idempotent_replay(organization: Organization, key: str, fingerprint: str) -> SynthesisJob | None:
    """The job an earlier request with this Idempotency-Key created, if it is still live.

    Lets a retry get its job back before anything else is checked (a retry
    must not fail because, say, no worker is up right now). A different body
    under the same key is a 422.
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


@dataclass(frozen=True)
class EtaBasis:
    """What the ETAs of one engine rest on; read once per engine per response.

    ``seconds_per_char`` is for one child: the pool's mean over the devices now
    serving the engine, weighted by their children (see ``eta_basis``).
    ``children`` is the number of live worker children serving the engine (at
    least 1, so an ETA exists while no worker is up).
    """

    seconds_per_char: float
    children: int
    devices: dict[str, int]


def serving_children(engine: str, workers: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """Live worker children serving ``engine``, counted by device, from the heartbeats.

    A child counts when it is ready (or recycling, about to be ready again) and
    its worker is configured for the engine. Redis being down only loses the
    count (the ETA then assumes one child), never the API answer.
    """
    if workers is None:
        try:
            workers = heartbeat.live_workers()
        except Exception as exc:
            log.warning("ETA without heartbeats: %s", exc)
            workers = []
    out: dict[str, int] = {}
    for w in workers:
        if w.get("state") in heartbeat.SERVING_STATES and engine in (w.get("engines") or []):
            device = str(w.get("device") or "cpu")
            out[device] = out.get(device, 0) + 1
    return out


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


def eta_basis(engine: str, workers: list[dict[str, Any]] | None = None) -> EtaBasis:
    """Seconds per character and children for the ETAs of ``engine`` (one query, one Redis read).

    With n_d live children on device d, each at s_d seconds per character
    (its rolling mean; the engine's all-device mean where the device has no
    history, DEFAULT_SECONDS_PER_CHAR where the engine has none):
        N = sum(n_d)                       children serving the engine
        s = N / sum(n_d / s_d)             one child's mean (the pool synthesises
                                           sum(n_d / s_d) characters per second)
    No live child: N = 1 and s = the engine's all-device mean.
    """
    devices = serving_children(engine, workers)
    by_device, overall = rolling_seconds_per_char(engine)
    fallback = overall if overall is not None else DEFAULT_SECONDS_PER_CHAR
    children = sum(devices.values())
    if children == 0:
        return EtaBasis(fallback, 1, {})
    chars_per_second = sum(n / by_device.get(d, fallback) for d, n in devices.items())
    return EtaBasis(children / chars_per_second, children, devices)


def seconds_per_char(engine: str) -> float:
    """One child's rolling mean synthesis seconds per character for ``engine`` (see eta_basis)."""
    return eta_basis(engine).seconds_per_char


def queue_position(job: SynthesisJob) -> int | None:
    """Queued jobs of the same engine (any tenant) created before this one; 0 = next."""
    if job.status != Status.QUEUED:
        return None
    return SynthesisJob.objects.filter(
        engine=job.engine, status=Status.QUEUED, created_at__lt=job.created_at
    ).count()


def estimate_eta(job: SynthesisJob, basis: EtaBasis | float | None = None) -> float | None:
    """Seconds until the job is likely done; None once finished.

    With s and N from ``eta_basis(engine)``:
      running: eta = s * text_chars * (1 - progress)
      queued:  ahead = queued jobs of the engine created before it + running jobs of the engine
               work  = their characters (running ones: text_chars * (1 - progress))
               wait  = 0 if ahead < N (a child is free for it) else s * work / N
               eta   = wait + s * text_chars
    The jobs ahead are shared among the N children, so the wait is their work
    divided by N; the job itself runs on one child. A bare float ``basis`` is a
    seconds-per-character figure with one child.
    """
    if job.is_finished:
        return None
    if basis is None:
        basis = eta_basis(job.engine)
    elif not isinstance(basis, EtaBasis):
        basis = EtaBasis(float(basis), 1, {})
    spc = basis.seconds_per_char
    if job.status == Status.RUNNING:
        return round(spc * job.text_chars * (1.0 - job.progress), 1)
    queued_ahead = Q(status=Status.QUEUED, created_at__lt=job.created_at)
    running = Q(status=Status.RUNNING)
    # One query for both: the ETA is computed on every job GET.
    ahead = SynthesisJob.objects.filter(
        engine=job.engine, status__in=(Status.QUEUED, Status.RUNNING)
    ).aggregate(
        queued_n=Count("id", filter=queued_ahead),
        queued_chars=Sum("text_chars", filter=queued_ahead),
        running_n=Count("id", filter=running),
        running_chars=Sum(F("text_chars") * (1.0 - F("progress")), filter=running),
    )
    jobs_ahead = ahead["queued_n"] + ahead["running_n"]
    work = float(ahead["queued_chars"] or 0) + float(ahead["running_chars"] or 0)
    wait = 0.0 if jobs_ahead < basis.children else spc * work / basis.children
    return round(wait + spc * job.text_chars, 1)


def abandon_job(job: SynthesisJob) -> None:
    """A synchronous caller gave up waiting: cancel the job and give its characters back now.

    A running job stops at its next sentence; its release is already written,
    so whatever the worker does later can charge nothing.
    """
    cancel_job_if_active(job)
    with transaction.atomic():
        locked = SynthesisJob.objects.select_for_update().filter(id=job.id).first()
        if locked is not None and locked.status != Status.SUCCEEDED:
            release_usage(locked)


def cancel_job_if_active(job: SynthesisJob) -> None:
    try:
        cancel_job(job)
    except Problem:
        pass  # finished meanwhile; nothing to cancel
    except SynthesisJob.DoesNotExist:
        pass


def usage_summary(
    organization: Organization, now: dt.datetime | None = None, days: int = 31
) -> dict[str, Any]:
    """What GET /api/v1/usage shows: plan, current period, characters, jobs, storage, daily totals."""
    now = now or timezone.now()
    plan = organization.plan
    period = period_start(now)
    row = UsagePeriod.objects.filter(organization=organization, period=period).first()
    used = row.characters_used if row else 0
    reserved = row.characters_reserved if row else 0
    counts = {
        s: n
        for s, n in SynthesisJob.objects.filter(organization=organization, status__in=SynthesisJob.ACTIVE)
        .values_list("status")
        .annotate(n=Count("id"))
    }
    since = dt.datetime.combine(
        (now - dt.timedelta(days=days - 1)).astimezone(dt.UTC).date(), dt.time(0), tzinfo=dt.UTC
    )
    daily: dict[str, dict[str, int]] = {}
    for day, kind, chars in (
        UsageEvent.objects.filter(organization=organization, created_at__gte=since)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values_list("day", "kind")
        .annotate(n=Sum("characters"))
        .order_by("day")
    ):
        entry = daily.setdefault(day.isoformat(), {"charged": 0, "reserved": 0, "released": 0, "jobs": 0})
        if kind == UsageEvent.Kind.CHARGE:
            entry["charged"] += chars
        elif kind == UsageEvent.Kind.RESERVE:
            entry["reserved"] += chars
        else:
            entry["released"] += chars
    for day, n in (
        SynthesisJob.objects.filter(organization=organization, created_at__gte=since)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values_list("day")
        .annotate(n=Count("id"))
    ):
        daily.setdefault(day.isoformat(), {"charged": 0, "reserved": 0, "released": 0, "jobs": 0})["jobs"] = n
    return {
        "plan": {
            "slug": plan.slug,
            "name": plan.name,
            "monthly_characters": plan.monthly_characters,
            "max_characters_per_request": plan.max_characters_per_request,
            "max_concurrent_jobs": plan.max_concurrent_jobs,
            "requests_per_minute": plan.requests_per_minute,
            "max_voices": plan.max_voices,
            "retention_days": plan.retention_days,
            "storage_bytes": plan.storage_bytes,
        },
        "period": {"start": period_start(now), "end": period_end(now)},
        "characters": {
            "used": used,
            "reserved": reserved,
            "limit": plan.monthly_characters,
            "remaining": max(0, plan.monthly_characters - used - reserved),
        },
        "jobs": {
            "queued": counts.get(Status.QUEUED, 0),
            "running": counts.get(Status.RUNNING, 0),
            "limit": plan.max_concurrent_jobs,
        },
        "storage": {"used_bytes": storage_used(organization), "limit_bytes": plan.storage_bytes},
        "daily": [{"date": day, **values} for day, values in sorted(daily.items())],
    }


def visible_voices(organization: Organization) -> Any:
    """Voices a tenant may use: the built-in ones and its own, ready ones only."""
    return Voice.objects.filter(
        Q(organization__isnull=True) | Q(organization=organization), status=Voice.Status.READY
    )


def delete_voice(organization: Organization, voice: Voice) -> None:
    """Delete a tenant's own voice (its jobs keep their voice name). Built-in voices cannot be deleted."""
    if voice.organization_id != organization.pk:
        raise Problem(403, "builtin_voice", "Built-in voices cannot be deleted.")
    with transaction.atomic():
        locked = Voice.objects.select_for_update().filter(pk=voice.pk).first()
        if locked is None:
            return
        path = locked.prompt_path
        locked.delete()
        transaction.on_commit(lambda: _remove_file(path))
