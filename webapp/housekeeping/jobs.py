"""The housekeeping jobs that keep disk, database and queues clean.

Each job is a function of a :class:`Context` registered in :data:`JOBS`;
:func:`run_job` runs one under a Redis lock (two runs never overlap), with a
time budget, records a :class:`HousekeepingRun` row and logs one line with
what it did. Celery beat calls them through ``webapp.housekeeping.tasks``;
``manage.py housekeeping <job>`` runs them by hand. Everything a job changes
about jobs goes through ``webapp.speech.services``, the same functions the
workers use, so there is one version of each state change.

Every job is idempotent and works in batches of ``TTS_HOUSEKEEPING_BATCH``:
a run that hits its time budget stops between batches, and the next run
continues where it left off.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from webapp.housekeeping import locks
from webapp.housekeeping.models import HousekeepingRun
from webapp.speech import heartbeat, services
from webapp.speech.models import IdempotencyKey, SynthesisJob, Voice

log = logging.getLogger("webapp.housekeeping")

JobStatus = SynthesisJob.Status

# The synth library writes ``.<name>.<hex>.part`` (and ``.part.f32``) next to
# the final file and renames it into place; these are files being written.
TEMP_SUFFIXES = (".part", ".partial", ".tmp", ".temp", ".f32")


# --------------------------------------------------------------------- framework


@dataclass
class Context:
    """What a job run gets: the time it runs at, its batch size and its deadline."""

    now: dt.datetime
    batch: int
    deadline: float  # time.monotonic() value
    counts: dict[str, int] = field(default_factory=dict)
    partial: bool = False

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(amount)

    def out_of_time(self) -> bool:
        """True when the budget is spent; the run is then recorded as partial."""
        if time.monotonic() >= self.deadline:
            self.partial = True
        return self.partial


@dataclass(frozen=True)
class Job:
    name: str
    run: Callable[[Context], None]
    description: str


@dataclass(frozen=True)
class RunResult:
    job: str
    skipped: bool
    outcome: str  # ok | partial | error | skipped
    counts: dict[str, int]
    duration_ms: int

    def summary(self) -> str:
        if self.skipped:
            return f"{self.job}: skipped (another run holds the lock)"
        parts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "nothing to do"
        return f"{self.job}: {self.outcome} {parts} duration_ms={self.duration_ms}"


JOBS: dict[str, Job] = {}


def job(name: str, description: str) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    def register(func: Callable[[Context], None]) -> Callable[[Context], None]:
        JOBS[name] = Job(name=name, run=func, description=description)
        return func

    return register


def soft_time_limit() -> int:
    return int(settings.TTS_HOUSEKEEPING_SOFT_TIME_LIMIT)


def hard_time_limit() -> int:
    return soft_time_limit() + 60


def lock_ttl() -> int:
    # Longer than the hard limit: a run Celery killed frees its lock by expiry,
    # a live run can never lose it.
    return hard_time_limit() + 60


def run_job(
    name: str,
    *,
    now: dt.datetime | None = None,
    batch: int | None = None,
    budget_seconds: float | None = None,
) -> RunResult:
    """Run one job unless another run of it holds the lock. Logs one line, records the run."""
    try:
        spec = JOBS[name]
    except KeyError:
        raise ValueError(f"unknown housekeeping job {name!r}; known: {', '.join(sorted(JOBS))}") from None
    with locks.hold(name, lock_ttl()) as acquired:
        if not acquired:
            log.info("housekeeping %s: skipped, another run holds the lock", name)
            return RunResult(name, True, "skipped", {}, 0)
        started = time.monotonic()
        started_at = now or timezone.now()
        # Stop between batches well before Celery's soft limit interrupts us mid-batch.
        # A manual --budget is capped too, so a run never outlives its lock's TTL.
        budget = soft_time_limit() * 0.8 if budget_seconds is None else min(budget_seconds, soft_time_limit())
        ctx = Context(
            now=started_at, batch=batch or settings.TTS_HOUSEKEEPING_BATCH, deadline=started + budget
        )
        outcome, error = HousekeepingRun.Outcome.OK, ""
        failure: BaseException | None = None
        try:
            spec.run(ctx)
        except SoftTimeLimitExceeded:
            outcome, error = HousekeepingRun.Outcome.PARTIAL, "soft time limit exceeded"
        except Exception as exc:
            outcome, error, failure = HousekeepingRun.Outcome.ERROR, f"{type(exc).__name__}: {exc}", exc
        else:
            if ctx.partial:
                outcome = HousekeepingRun.Outcome.PARTIAL
        duration_ms = int((time.monotonic() - started) * 1000)
        result = RunResult(name, False, str(outcome), dict(ctx.counts), duration_ms)
        if failure is None:
            log.info("housekeeping %s", result.summary())
        else:
            log.error("housekeeping %s error=%s", result.summary(), error, exc_info=failure)
        try:
            # Runs that found nothing to do (most runs of the 30 s jobs) are only logged.
            if outcome != HousekeepingRun.Outcome.OK or any(result.counts.values()):
                HousekeepingRun.objects.create(
                    job=name,
                    started_at=started_at,
                    duration_ms=duration_ms,
                    outcome=outcome,
                    counts=result.counts,
                    error=error[:1000],
                )
        except Exception as exc:  # the record is secondary to the work done
            log.warning("housekeeping %s: could not record the run: %s", name, exc)
        if failure is not None:
            raise failure
        return result


# --------------------------------------------------------------------- helpers


def media_root() -> Path:
    return Path(settings.MEDIA_ROOT).resolve()


def media_file(relative: str) -> Path | None:
    """The absolute path of a stored relative path, or None when it would leave MEDIA_ROOT."""
    if not relative:
        return None
    root = media_root()
    path = (root / relative).resolve()
    if path == root or root not in path.parents:
        log.warning("housekeeping: refusing to touch %r, outside MEDIA_ROOT", relative)
        return None
    return path


def remove_file(path: Path | None) -> int:
    """Unlink a regular file; returns the bytes freed (0 when it was already gone)."""
    if path is None:
        return 0
    try:
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            return 0
        path.unlink()
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def is_temp_name(name: str) -> bool:
    """A file some writer is still producing, by the naming conventions in use."""
    if name.startswith((".", "~")):
        return True
    return any(name.endswith(s) or f"{s}." in name for s in TEMP_SUFFIXES)


def voice_path_fields() -> list[str]:
    """Every ``*_path`` field of Voice (prompt_path today; embeddings may follow)."""
    return [
        f.name
        for f in Voice._meta.get_fields()
        if isinstance(f, models.CharField) and f.name.endswith("_path")
    ]


def temp_dirs() -> list[Path]:
    """The configured temp folders, minus any that would be dangerous to purge."""
    protected = {Path("/"), media_root(), Path(settings.VAR_DIR).resolve(), Path(settings.BASE_DIR).resolve()}
    out = []
    for raw in settings.TTS_TEMP_DIRS:
        path = Path(raw).resolve()
        # Never the root, MEDIA_ROOT, var/ or the checkout, nor a folder above one of them.
        if any(path == p or path in p.parents for p in protected):
            log.warning("housekeeping: not purging %s, it is not a temp folder", path)
            continue
        out.append(path)
    return out


def _delete_in_batches(qs: models.QuerySet[Any], ctx: Context) -> int:
    deleted = 0
    while not ctx.out_of_time():
        pks = list(qs.order_by().values_list("pk", flat=True)[: ctx.batch])
        if not pks:
            break
        n, _ = qs.model.objects.filter(pk__in=pks).delete()
        deleted += n
        if len(pks) < ctx.batch:
            break
    return deleted


# --------------------------------------------------------------------- jobs


def expired_job_ids(now: dt.datetime, limit: int) -> list[Any]:
    """Succeeded jobs whose audio is past retention, oldest first (a plain read, no lock)."""
    return list(
        SynthesisJob.objects.filter(status=JobStatus.SUCCEEDED, expires_at__lte=now)
        .order_by("expires_at", "id")
        .values_list("id", flat=True)[:limit]
    )


@job("expire_audio", "Remove audio past the tenant's retention, mark the job expired, release storage.")
def expire_audio(ctx: Context) -> None:
    # The listing is a plain read and may be stale by the time a row is reached;
    # services.expire_audio re-checks status and expires_at under the row lock,
    # so a job that changed meanwhile (finished anew, deleted) is left alone.
    while not ctx.out_of_time():
        ids = expired_job_ids(ctx.now, ctx.batch)
        if not ids:
            break
        for job_id in ids:
            ctx.add("bytes_released", services.expire_audio(job_id))
        expired = SynthesisJob.objects.filter(id__in=ids, status=JobStatus.EXPIRED).count()
        ctx.add("expired", expired)
        if expired == 0 or len(ids) < ctx.batch:
            break


@job(
    "reap_stuck_jobs",
    "Re-queue running jobs whose lease expired; fail them worker_lost when attempts run out.",
)
def reap_stuck_jobs(ctx: Context) -> None:
    while not ctx.out_of_time():
        requeued, failed = services.requeue_expired_leases(limit=ctx.batch)
        ctx.add("requeued", requeued)
        ctx.add("failed", failed)
        if requeued + failed < ctx.batch:
            break


@job("redispatch_jobs", "Send the message of queued jobs that were never dispatched (broker down at submit).")
def redispatch_jobs(ctx: Context) -> None:
    while not ctx.out_of_time():
        sent = services.redispatch_undispatched(limit=ctx.batch)
        ctx.add("dispatched", sent)
        if sent < ctx.batch:
            break
    cutoff = timezone.now() - dt.timedelta(seconds=settings.TTS_DISPATCH_GRACE_SECONDS)
    # Non-zero here after a run means the broker is still unreachable.
    ctx.add(
        "still_undispatched",
        SynthesisJob.objects.filter(
            status=JobStatus.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff
        ).count(),
    )


@dataclass(frozen=True)
class _Candidate:
    relative: str
    path: Path
    size: int
    mtime: float


def _job_id_of(name: str) -> str | None:
    """Audio files (and their temp files) are named after their job's UUID."""
    try:
        return str(uuid.UUID(name.lstrip(".").split(".", 1)[0]))
    except ValueError:
        return None


def _remove_unreferenced(candidates: list[_Candidate], ctx: Context) -> None:
    if not candidates:
        return
    # Active jobs first, then references: a job finishing between the two
    # queries is caught by one or the other (it sets audio_path as it leaves running).
    job_ids = {jid for c in candidates if (jid := _job_id_of(c.path.name))}
    active = {
        str(i)
        for i in SynthesisJob.objects.filter(id__in=job_ids, status__in=SynthesisJob.ACTIVE).values_list(
            "id", flat=True
        )
    }
    relatives = [c.relative for c in candidates]
    referenced = set(
        SynthesisJob.objects.filter(audio_path__in=relatives).values_list("audio_path", flat=True)
    )
    for name in voice_path_fields():
        referenced.update(Voice.objects.filter(**{f"{name}__in": relatives}).values_list(name, flat=True))
    for c in candidates:
        if c.relative in referenced or _job_id_of(c.path.name) in active:
            ctx.add("referenced")
            continue
        try:
            if c.path.lstat().st_mtime != c.mtime:
                ctx.add("too_recent")  # written to since we looked
                continue
        except FileNotFoundError:
            continue
        freed = remove_file(c.path)
        ctx.add("removed")
        ctx.add("bytes_freed", freed)


@job(
    "remove_orphan_files",
    "Remove files under MEDIA_ROOT no job or voice references, older than the grace period.",
)
def remove_orphan_files(ctx: Context) -> None:
    root = media_root()
    if not root.is_dir():
        return
    now_ts = ctx.now.timestamp()
    cutoff = now_ts - settings.TTS_ORPHAN_GRACE_SECONDS
    # A temp-named file is some writer's work in progress; only a long-abandoned one
    # (older than any job may run, and than the temp age) is an orphan.
    temp_cutoff = now_ts - max(
        settings.TTS_TEMP_MAX_AGE_SECONDS, settings.TTS_ORPHAN_GRACE_SECONDS, 2 * settings.TTS_MAX_JOB_SECONDS
    )
    # Temp folders are purge_temp_files' business; voice models and static files
    # are nobody's rows, should they be configured inside MEDIA_ROOT.
    skip = set(temp_dirs()) | {
        Path(p).resolve() for p in (settings.TTS_VOICES_DIR, settings.STATIC_ROOT, settings.LOG_DIR)
    }
    batch: list[_Candidate] = []
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if (here / d) not in skip]
        for name in filenames:
            scanned += 1
            if scanned % 1000 == 0 and ctx.out_of_time():
                return  # the candidates gathered so far wait for the next run
            path = here / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # links, sockets, ...: not ours to remove
            if st.st_mtime > (temp_cutoff if is_temp_name(name) else cutoff):
                ctx.add("too_recent")
                continue
            batch.append(_Candidate(str(path.relative_to(root)), path, st.st_size, st.st_mtime))
            if len(batch) >= ctx.batch:
                _remove_unreferenced(batch, ctx)
                batch = []
                if ctx.out_of_time():
                    return
    _remove_unreferenced(batch, ctx)


@job(
    "purge_temp_files",
    "Purge files (and empty folders) older than TTS_TEMP_MAX_AGE_SECONDS from the temp folders.",
)
def purge_temp_files(ctx: Context) -> None:
    cutoff = ctx.now.timestamp() - settings.TTS_TEMP_MAX_AGE_SECONDS
    seen = 0
    for top in temp_dirs():
        if not top.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
            here = Path(dirpath)
            try:
                # Taken before we unlink anything here, which bumps it: a folder
                # nobody wrote in for that long goes once it is empty.
                folder_mtime = here.lstat().st_mtime
            except FileNotFoundError:
                continue
            for name in filenames:
                path = here / name
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                if st.st_mtime > cutoff:
                    continue
                ctx.add("bytes_freed", remove_file(path))
                ctx.add("removed")
                seen += 1
                if seen % ctx.batch == 0 and ctx.out_of_time():
                    return
            if here != top and folder_mtime <= cutoff:
                try:
                    here.rmdir()  # fails, harmlessly, when not empty
                    ctx.add("folders_removed")
                except OSError:
                    pass


@job(
    "prune_records",
    "Delete idempotency keys past their TTL, old run records; give TTL-less heartbeats a TTL.",
)
def prune_records(ctx: Context) -> None:
    keys_cutoff = ctx.now - dt.timedelta(hours=settings.TTS_IDEMPOTENCY_TTL_HOURS)
    ctx.add(
        "idempotency_keys", _delete_in_batches(IdempotencyKey.objects.filter(created_at__lt=keys_cutoff), ctx)
    )
    runs_cutoff = ctx.now - dt.timedelta(days=settings.TTS_AUDIT_RETENTION_DAYS)
    ctx.add(
        "run_records", _delete_in_batches(HousekeepingRun.objects.filter(started_at__lt=runs_cutoff), ctx)
    )
    # Heartbeats expire by TTL; one written without (a bug, a manual SET) would
    # show a dead worker as live forever. Give it the TTL it should have had.
    r = heartbeat.client()
    for key in r.scan_iter(match=heartbeat.KEY_PREFIX + "*", count=ctx.batch):
        if r.ttl(key) == -1:
            r.expire(key, settings.TTS_HEARTBEAT_TTL)
            ctx.add("heartbeats_given_ttl")


@job("reject_stale_voices", "Mark voice prompts left in processing too long as rejected, with a reason.")
def reject_stale_voices(ctx: Context) -> None:
    timeout = settings.TTS_VOICE_PROCESSING_TIMEOUT_SECONDS
    cutoff = ctx.now - dt.timedelta(seconds=timeout)
    reason = (
        f"Analysis of this voice prompt did not finish within {max(1, timeout // 60)} minutes; "
        "please upload it again."
    )
    stale = Voice.objects.filter(status=Voice.Status.PROCESSING, updated_at__lt=cutoff)
    while not ctx.out_of_time():
        pks = list(stale.order_by("updated_at").values_list("pk", flat=True)[: ctx.batch])
        if not pks:
            break
        with transaction.atomic():
            # The conditions are repeated in the UPDATE: a voice whose analysis
            # finished meanwhile is no longer 'processing' and stays as it is.
            n = stale.filter(pk__in=pks).update(
                status=Voice.Status.REJECTED, status_reason=reason, updated_at=ctx.now
            )
        ctx.add("rejected", n)
        if len(pks) < ctx.batch:
            break


def _has_any_path(fields: Iterable[str]) -> models.Q:
    q = models.Q()
    for name in fields:
        q |= ~models.Q(**{name: ""})
    return q


@job("delete_voice_files", "Delete the prompt files of deleted voices and clear their paths.")
def delete_voice_files(ctx: Context) -> None:
    fields = voice_path_fields()
    pending = Voice.objects.filter(_has_any_path(fields), status=Voice.Status.DELETED)
    while not ctx.out_of_time():
        pks = list(pending.order_by("updated_at").values_list("pk", flat=True)[: ctx.batch])
        if not pks:
            break
        for pk in pks:
            with transaction.atomic():
                voice = pending.select_for_update().filter(pk=pk).first()
                if voice is None:
                    continue
                paths = [getattr(voice, name) for name in fields if getattr(voice, name)]
                for name in fields:
                    setattr(voice, name, "")
                voice.prompt_bytes = 0
                voice.save(update_fields=[*fields, "prompt_bytes", "updated_at"])
            # Files go after commit: a crash in between leaves an orphan file for
            # remove_orphan_files, never a row pointing at nothing.
            for relative in paths:
                ctx.add("bytes_freed", remove_file(media_file(relative)))
            ctx.add("voices")
        if len(pks) < ctx.batch:
            break
