"""Celery tasks: thin wrappers around ``speech.services`` and ``synth``.

``synthesize_job`` runs on the engine's queue (``synth.piper``, ``synth.espeak``).
The job row is the truth: the task claims it with a conditional update (a
redelivered or duplicate message finds nothing to claim), reports progress
sentence by sentence (which renews the lease and reads the cancel flag),
lets ``synth`` write the audio to a temporary name and rename it into place,
and settles the job exactly once through the services. Whatever goes wrong,
no partial file stays behind and the child decides afterwards whether it
should be replaced (``worker.after_task``).
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from celery.exceptions import Reject, SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.utils import timezone

# The project's app, not shared_task: a web process that never imported
# webapp.celery must still send to the configured broker.
from webapp.celery import app
from webapp.speech import recycling, services, worker
from webapp.speech.models import SynthesisJob

log = logging.getLogger(__name__)

T = TypeVar("T")

_DB_ERRORS = (OperationalError, InterfaceError)
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class JobLost(Exception):
    """The database stayed unreachable; the message goes back to the queue."""


def db_retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a service, riding out a PostgreSQL outage (growing pauses) up to TTS_WORKER_DB_RETRY_SECONDS."""
    deadline = time.monotonic() + settings.TTS_WORKER_DB_RETRY_SECONDS
    pause = 0.25
    while True:
        try:
            return fn(*args, **kwargs)
        except _DB_ERRORS as exc:
            for conn in connections.all(initialized_only=True):
                try:
                    conn.close()
                except Exception:  # noqa: S110 - a dead connection may fail to close; it is dropped anyway
                    pass
            if time.monotonic() + pause > deadline:
                raise JobLost(f"database unreachable: {exc}") from exc
            log.warning("database unreachable (%s); retrying in %.1f s", str(exc).strip()[:200], pause)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


def is_out_of_memory(exc: BaseException) -> bool:
    """Host MemoryError, torch.cuda.OutOfMemoryError, or a runtime's allocation failure."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "out of memory" in text or "failed to allocate memory" in text


def storage_error_code(exc: BaseException) -> str | None:
    """``disk_full`` / ``storage_error`` when ``exc`` is a failure to write the audio, else None.

    libsndfile reports a failed write as "System error." (SF_ERR_SYSTEM) and
    leaves the reason in the C errno, which cffi keeps for the calling thread.
    """
    if isinstance(exc, OSError):
        return "disk_full" if exc.errno in _DISK_FULL_ERRNOS else "storage_error"
    if type(exc).__name__ == "LibsndfileError" and getattr(exc, "code", None) == 2:
        try:
            import soundfile

            err = int(soundfile._ffi.errno)
        except Exception:
            err = 0
        return "disk_full" if err in _DISK_FULL_ERRNOS else "storage_error"
    return None


def _remove_partials(out_path: str) -> None:
    """synth writes ``.<name>.<random>.part`` beside the target; none may survive a failure."""
    directory, base = os.path.split(out_path)
    for leftover in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}.*.part*")):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove partial file %s: %s", leftover, exc)


def _relative_path(organization_id: Any, job_id: Any, fmt: str) -> str:
    return os.path.join("audio", str(organization_id), f"{job_id}.{fmt}")


def _clean_after_dead_owner(job_id: str) -> None:
    """The job was just given up (``worker_lost``): remove what its killed runs left."""
    try:
        row = (
            SynthesisJob.objects.filter(id=job_id).values_list("organization_id", "format", "status").first()
        )
    except _DB_ERRORS:
        return  # the orphan sweep removes old temporary files
    if row is not None and row[2] != SynthesisJob.Status.SUCCEEDED:
        _remove_partials(services.audio_abspath(_relative_path(row[0], job_id, row[1])))


def _discard_output(job_id: str, relative: str, out_path: str) -> None:
    """Remove our file unless the job row says it is the job's audio."""
    _remove_partials(out_path)
    try:
        kept = SynthesisJob.objects.filter(
            id=job_id, status=SynthesisJob.Status.SUCCEEDED, audio_path=relative
        ).exists()
    except _DB_ERRORS:
        return  # cannot tell: leave it to the orphan sweep rather than delete a delivered file
    if not kept:
        try:
            os.unlink(out_path)
        except FileNotFoundError:
            pass


def _inject_faults(job: SynthesisJob) -> None:
    """Test-only faults (tests/reliability): off unless the TTS_FAULT_* settings are set."""
    crash = settings.TTS_FAULT_CRASH_MARKER
    if crash and crash in job.text:
        log.error("fault injection: job %s kills its worker child", job.id)
        os._exit(70)
    oom = settings.TTS_FAULT_OOM_MARKER
    if oom and oom in job.text:
        raise MemoryError("fault injection: simulated out-of-memory")


@app.task(
    bind=True, name="speech.synthesize_job", acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def synthesize_job(self: Any, job_id: str) -> str:
    state = worker.current()
    if not state.ready:
        # Should not happen (the child loads before taking work); never run without a model.
        recycling.request_exit("not_loaded child took a task without a model")
        raise Reject("worker child has no model", requeue=True)
    engine: str | None = None
    rtf: float | None = None
    oom = False
    outcome = "skipped"
    try:
        # (hard, soft) as sent with the message by services.dispatch_job.
        limits = tuple(getattr(self.request, "timelimit", None) or (None, None))
        outcome, engine, rtf, oom = _run(state, job_id, limits[1] if len(limits) > 1 else None)
    except JobLost as exc:
        log.error("job %s: %s; message handed back", job_id, exc)
        raise Reject(str(exc), requeue=True) from exc
    finally:
        state.current_job = None
        worker.after_task(state, engine, rtf, oom=oom)
    return outcome


def _run(
    state: worker.WorkerState, job_id: str, soft_limit: float | None = None
) -> tuple[str, str | None, float | None, bool]:
    """(outcome, engine, rtf, out_of_memory) for one delivery of a job's message."""
    from synth import SynthesisRequest
    from synth.errors import Cancelled, SynthError

    me = state.worker_id
    owner = db_retry(
        lambda: (
            SynthesisJob.objects.filter(id=job_id, status=SynthesisJob.Status.RUNNING)
            .values_list("worker", flat=True)
            .first()
        )
    )
    dead = [owner] if owner and worker.owner_is_dead(owner, me) else []
    job = db_retry(services.claim_job, job_id, me, dead)
    if job is None:
        if dead:
            _clean_after_dead_owner(job_id)
        return "skipped", None, None, False
    claimed = timezone.now()
    state.current_job = str(job.id)
    relative = _relative_path(job.organization_id, job.id, job.format)
    out_path = services.audio_abspath(relative)
    # A killed earlier attempt ran no cleanup: its temporary file is ours to remove.
    _remove_partials(out_path)
    rss_before = round(state.health.last_rss_mb or recycling.read_rss_mb(), 1)
    params = job.params or {}
    stop = {"flag": False}

    def progress(done: int, total: int) -> None:
        stage = "encoding" if done >= total else f"synthesising {done + 1}/{total}"
        stop["flag"] = db_retry(services.report_progress, job_id, me, done, total, stage)

    try:
        _inject_faults(job)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        request = SynthesisRequest(
            text=job.text,
            voice=job.voice_name,
            format=job.format,
            sample_rate=job.sample_rate,
            speed=float(params.get("speed", 1.0)),
            pitch=float(params.get("pitch", 0.0)),
            volume=float(params.get("volume", 0.0)),
            language=params.get("language"),
            instructions=params.get("instructions"),
        )
        result = state.synthesizer.synthesize(
            request, out_path, progress=progress, should_cancel=lambda: stop["flag"]
        )
        metrics: dict[str, Any] = {
            "queue_ms": max(0, int((claimed - job.created_at).total_seconds() * 1000)),
            "synth_ms": result.synth_ms,
            "audio_seconds": round(result.duration_seconds, 3),
            "rtf": round(result.rtf, 4),
            "peak_rss_mb": result.peak_rss_mb,
            "peak_gpu_mb": result.peak_gpu_mb,
            "engine": result.engine,
            "device": result.device,
            "worker": me,
            "host": state.worker_id.rpartition(":")[0],
            "pid": state.pid,
            "node": state.node,
            "attempt": job.attempts,
            "child_task_no": state.tasks_done + 1,
            "child_rss_before_mb": rss_before,
            "chunks": result.chunks,
        }
        done = db_retry(
            services.complete_job,
            job_id,
            me,
            audio_path=relative,
            audio_bytes=result.bytes,
            duration_seconds=result.duration_seconds,
            metrics=metrics,
            applied_instructions={"applied": result.applied, "not_applied": result.not_applied},
        )
        if not done:
            # Canceled or re-claimed meanwhile: this file is not the job's audio.
            _discard_output(job_id, relative, out_path)
            return "lost", result.engine, result.rtf, False
        return "succeeded", result.engine, result.rtf, False
    except Cancelled:
        _discard_output(job_id, relative, out_path)
        canceled = db_retry(services.finish_canceled, job_id, me)
        return ("canceled" if canceled else "lost"), None, None, False
    except SoftTimeLimitExceeded:
        _discard_output(job_id, relative, out_path)
        soft = soft_limit or services.job_time_limits(job.text_chars)[0]
        db_retry(
            services.fail_job,
            job_id,
            "timeout",
            f"Synthesis took longer than the {soft:g} s allowed for {job.text_chars} characters.",
            worker_id=me,
        )
        return "timeout", None, None, False
    except SynthError as exc:
        _discard_output(job_id, relative, out_path)
        db_retry(services.fail_job, job_id, exc.code, exc.message, worker_id=me)
        return f"failed:{exc.code}", None, None, False
    except JobLost:
        _discard_output(job_id, relative, out_path)
        raise
    except Exception as exc:
        _discard_output(job_id, relative, out_path)
        code = storage_error_code(exc)
        if code is not None:
            detail = "The audio storage is full." if code == "disk_full" else "The audio could not be stored."
            log.error("job %s: %s (%s)", job_id, code, exc)
            db_retry(services.fail_job, job_id, code, f"{detail} Try again later.", worker_id=me)
            return f"failed:{code}", None, None, False
        if is_out_of_memory(exc):
            return _out_of_memory(job_id, me, exc), None, None, True
        log.exception("job %s failed unexpectedly", job_id)
        db_retry(services.fail_job, job_id, "synthesis_failed", f"{type(exc).__name__}: {exc}", worker_id=me)
        return "failed:synthesis_failed", None, None, False


def _out_of_memory(job_id: str, me: str, exc: BaseException) -> str:
    """Re-queue once (a fresh child may well manage), then give up with ``resource_exhausted``."""
    log.error("job %s ran out of memory: %s", job_id, exc)
    retries = db_retry(
        lambda: SynthesisJob.objects.filter(id=job_id).values_list("oom_retries", flat=True).first()
    )
    if retries is not None and retries < settings.TTS_JOB_OOM_RETRIES:
        if db_retry(services.requeue_job, job_id, me, reason="out of memory", oom=True):
            return "requeued:oom"
    db_retry(
        services.fail_job,
        job_id,
        "resource_exhausted",
        "The worker ran out of memory on this job, also after a retry on a fresh worker.",
        worker_id=me,
    )
    return "failed:resource_exhausted"
