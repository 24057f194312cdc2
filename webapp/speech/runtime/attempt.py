"""The attempt runner: synthesise one claimed job and settle it exactly once.

An attempt is one claim of a job by this child: its fencing token, its own
file (``outputs.attempt_path``) and its limits. Progress is written sentence
by sentence through the lifecycle (renewing the lease, reading the cancel
flag); a write that comes back "lost" stops the run at once. The soft limit
is a budget of the child's CPU time, checked at each sentence (a busy host
slows a job without using it up); the hard limit is an alarm in the child and
the deadline on the row, both wall clock. Whatever goes wrong, the attempt
removes its own files and ends the job through one lifecycle transition; the
child decides afterwards whether it should be replaced (``worker.after_task``).
docs/workers.md tells the whole flow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.utils import timezone

from synth import SynthesisRequest
from synth.errors import Cancelled, SynthError
from synth.stream import StreamWriter, stream_path
from webapp.audit import context as request_context
from webapp.dictionaries import services as dictionary_services
from webapp.errors import JobFailureCode
from webapp.speech import lifecycle
from webapp.speech.lifecycle import Verdict
from webapp.speech.models import SynthesisJob
from webapp.speech.runtime import hooks, mode, recycling, worker
from webapp.speech.services import notify, prompts, sentence_cache
from webapp.speech.services.files import media_path
from webapp.speech.services.outputs import (
    attempt_path,
    discard_output,
    fsync_output,
    remove_partials,
    storage_error_code,
)

log = logging.getLogger(__name__)


T = TypeVar("T")

DB_ERRORS = (OperationalError, InterfaceError)


class JobLost(Exception):
    """The database stayed unreachable; the message goes back to the queue."""


class AttemptLost(Exception):
    """A write of this attempt matched no row: another attempt owns the job now, or it ended."""


class ConsentWithdrawn(Exception):
    """The voice this job clones may not be cloned any more (its consent revoked)."""


class SoftLimitReached(Exception):
    """The job used up its CPU-time budget (the soft limit): stop before the next sentence."""


class HardLimitReached(BaseException):
    """The job's hard limit passed (an alarm in the child).

    A BaseException, so that no library's ``except Exception`` swallows it.
    """


def _drop_connections(retry_state: Any = None) -> None:
    """A dead connection must not be reused by the next attempt; it may fail to close, it is dropped anyway."""
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(Exception):
            conn.close()
    if retry_state is not None and retry_state.outcome is not None:
        exc = retry_state.outcome.exception()
        log.warning("database unreachable (%s); retrying", str(exc).strip()[:200])


def db_retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a service, riding out a PostgreSQL outage (growing pauses) up to TTS_WORKER_DB_RETRY_SECONDS."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(DB_ERRORS),
        wait=tenacity.wait_exponential(multiplier=0.25, max=5.0),
        stop=tenacity.stop_before_delay(settings.TTS_WORKER_DB_RETRY_SECONDS),
        before_sleep=_drop_connections,
        reraise=True,
    )
    try:
        return retrying(fn, *args, **kwargs)
    except DB_ERRORS as exc:
        _drop_connections()
        raise JobLost(f"database unreachable: {exc}") from exc


def is_out_of_memory(exc: BaseException) -> bool:
    """Host MemoryError, torch.cuda.OutOfMemoryError, or a runtime's allocation failure."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "out of memory" in text or "failed to allocate memory" in text


@dataclass(frozen=True)
class Outcome:
    """How one delivery of a message ended, for the log and the child's recycle check."""

    name: str  # succeeded, canceled, lost, skipped, failed:<code>, requeued:oom, requeued:shutdown
    engine: str | None = None
    cpu_seconds: float | None = None  # with characters: the child's drift check (CPU seconds per character)
    characters: int = 0
    out_of_memory: bool = False


SKIPPED = Outcome("skipped")


@dataclass
class Attempt:
    """One claim of a job by this child: its token, its own file and its limits."""

    job: SynthesisJob
    relative: str
    out_path: str
    soft: float  # seconds of CPU time per inference thread
    hard: float  # wall-clock seconds from the claim
    started: float  # time.monotonic() at the claim
    claimed_at: Any
    # The soft limit's clock: this process's CPU time (all its threads: the
    # runtime's inference threads too). Wall time would also count the time a
    # busy host gave to other processes, and stop a job that is advancing.
    cpu_clock: Callable[[], float] = time.process_time
    cpu_started: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.cpu_started = self.cpu_clock()

    @property
    def token(self) -> int:
        return int(self.job.claim_token)

    @property
    def cpu_seconds(self) -> float:
        """CPU time spent on this attempt so far."""
        return self.cpu_clock() - self.cpu_started

    @property
    def cpu_budget(self) -> float:
        """The soft limit in CPU seconds: inference threads run in parallel, each may spend it."""
        return self.soft * max(1, settings.TTS_WORKER_THREADS, settings.TTS_WORKER_SOLO_THREADS)


def run_claimed(state: worker.WorkerState, job: SynthesisJob, limits: tuple[float, float]) -> Outcome:
    """Synthesise a claimed job, then settle it exactly once (a batching child runs several at once)."""
    request_context.bind_job(job)  # from here every log line names this job's request id
    log.info(
        "job %s: attempt %s claimed by %s (token %s)", job.id, job.attempts, state.worker_id, job.claim_token
    )
    soft, hard = limits
    relative = attempt_path(job)
    started, now = time.monotonic(), timezone.now()
    attempt = Attempt(
        job,
        relative,
        media_path(relative),
        soft,
        hard,
        started,
        now,
        cpu_clock=mode.cpu_clock(job.engine, state.models),
    )
    state.current_job, state.current_lane = str(job.id), job.lane
    rss_before = round(state.health.last_rss_mb or recycling.read_rss_mb(), 1)
    with state.watching(str(job.id), attempt.token):  # the watchdog ends a child stuck past its job's end
        return _run(state, attempt, rss_before)


def _run(state: worker.WorkerState, attempt: Attempt, rss_before: float) -> Outcome:
    """The attempt itself: synthesise under the hard limit, publish through the lifecycle, clean up."""
    job, relative = attempt.job, attempt.relative
    try:
        with _hard_limit(attempt):
            hooks.before_synthesis(job)
            result = _synthesize(state, attempt)
            cpu_seconds = attempt.cpu_seconds
            fsync_output(attempt.out_path)
        hooks.before_commit(job)
        done = db_retry(
            lifecycle.complete_job,
            job.id,
            attempt.token,
            audio_path=relative,
            audio_bytes=result.bytes,
            duration_seconds=result.duration_seconds,
            metrics=_metrics(state, attempt, result, rss_before, cpu_seconds),
            timestamps=getattr(result, "timestamps", None),  # a test's stand-in result may have none
            applied_instructions={
                "applied": result.applied,
                "not_applied": result.not_applied,
                "dictionaries": result.dictionaries,
            },
            cached_characters=getattr(result, "cached_characters", 0),  # (a test's stand-in may have none)
            awaited=job.waiter_until is not None,
        )
    except JobLost:
        discard_output(job.id, attempt.token, relative)
        raise
    except HardLimitReached:
        discard_output(job.id, attempt.token, relative)
        _drop_connections()  # the alarm may have cut a query short
        return _hard_limit_failure(attempt)
    except Exception as exc:
        discard_output(job.id, attempt.token, relative)
        return _settle_failure(attempt, exc)
    if not done:
        # Canceled or taken over meanwhile: this file is not the job's audio.
        discard_output(job.id, attempt.token, relative)
        return Outcome("lost", result.engine, cpu_seconds, job.text_chars)
    remove_partials(attempt.out_path)  # the stream file: readers still streaming keep it open
    return Outcome("succeeded", result.engine, cpu_seconds, job.text_chars)


def _hard_limit_failure(attempt: Attempt) -> Outcome:
    return _failed(
        attempt,
        JobFailureCode.TIMEOUT,
        f"The job ran past its hard time limit of {attempt.hard:g} s and was stopped.",
    )


def _past_hard_limit_in_a_thread(attempt: Attempt) -> bool:
    """A job in a thread of its own (a batching or relaying child) has no alarm: the engine's cancel
    check stops it once its hard limit has passed, and the failure is settled as the alarm's."""
    return (
        threading.current_thread() is not threading.main_thread()
        and time.monotonic() - attempt.started >= attempt.hard
    )


@contextlib.contextmanager
def _hard_limit(attempt: Attempt) -> Iterator[None]:
    """Raise HardLimitReached in this (the task's) thread once the job's hard limit has passed.

    Celery's own hard limit is one ceiling above every job's (dispatch.celery_time_limit);
    it only kills a child stuck where Python cannot run this alarm's handler.
    """

    def expired(signum: int, frame: Any) -> None:
        raise HardLimitReached()

    if threading.current_thread() is not threading.main_thread():
        # Signals reach only the main thread: the engine's cancel check stops a job in a thread
        # (_past_hard_limit_in_a_thread), and the row's deadline and the reaper remain.
        yield
        return
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, attempt.hard - (time.monotonic() - attempt.started)))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _synthesize(state: worker.WorkerState, attempt: Attempt) -> Any:
    """Run synth on the job's text into this attempt's file.

    After each sentence one fenced write records progress, renews the lease and
    reads the cancel flag. Its answer is acted on at once, in the same call:
    "lost" raises AttemptLost and the run stops before its next sentence; so
    does a spent CPU budget (the soft limit). A cancel is read at the next
    sentence's check.
    """
    job = attempt.job
    params = job.params or {}
    cancel = {"requested": False}

    def progress(done: int, total: int) -> None:
        stage = "encoding" if done >= total else f"synthesising {done + 1}/{total}"
        verdict = db_retry(lifecycle.report_progress, job.id, attempt.token, done, total, stage)
        if verdict is Verdict.LOST:
            raise AttemptLost()
        cancel["requested"] = verdict is Verdict.CANCEL
        hooks.after_progress(job, done, total)
        if done < total and attempt.cpu_seconds > attempt.cpu_budget:
            raise SoftLimitReached()

    if job.cloning_mode == prompts.ZERO_SHOT and job.voice is not None:
        # Revoked after submit, before the revocation failed this job (or while it did).
        refusal = prompts.consent_refusal(job.voice)
        if refusal is not None:
            raise ConsentWithdrawn(refusal)
    os.makedirs(os.path.dirname(attempt.out_path), exist_ok=True)
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
        loudness_lufs=params.get("loudness"),
        seed=params.get("seed"),  # the API's seed, for a model whose seed capability is true
        # An uploaded voice cloned zero-shot: the engine gets its prompt (docs/voices.md).
        prompt=prompts.voice_prompt(job.voice) if job.cloning_mode == prompts.ZERO_SHOT else None,
        # The versions pinned at submit (a dictionary cannot be deleted while the job is unfinished).
        dictionaries=tuple(dictionary_services.lexicons(job.dictionaries or [])),
    )
    # The tenant's sentence cache for this voice (None: ``cache: false``, or the plan keeps none).
    cache = sentence_cache.job_store(job, before_write=lambda: hooks.before_cache_write(job))
    try:
        return _run_synthesis(state, job, attempt, request, progress, cancel, cache)
    finally:
        if cache is not None and cache.written:
            # Counted also when the job failed after: the entries are on disk either way.
            with contextlib.suppress(Exception):
                sentence_cache.count_written(job.organization_id, cache.written)


CANCEL_WATCH_SECONDS = 0.5  # how often a remote model's job reads its cancel flag mid-sentence


class _CancelWatch:
    """The cancel flags of the remote models' jobs running in this process, read mid-sentence.

    A job reads its cancel flag when it reports a sentence done (``report_progress``). A remote
    model's sentence is a request to its upstream, which a cancel should close at once rather
    than let run: for those, one thread of the process reads every such job's flag in one query
    each ``CANCEL_WATCH_SECONDS`` (a relaying child runs dozens at once: a thread and a database
    connection each would double what they hold). It runs while a job is watched.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[Any, threading.Event] = {}  # job id -> set once its cancel is asked
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, job_id: Any) -> Iterator[Callable[[], bool]]:
        asked = threading.Event()
        with self._lock:
            self._asked[job_id] = asked
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cancel-watch", daemon=True)
                self._thread.start()
        try:
            yield asked.is_set
        finally:
            with self._lock:
                self._asked.pop(job_id, None)

    def _run(self) -> None:
        try:
            while True:
                time.sleep(CANCEL_WATCH_SECONDS)
                with self._lock:
                    if not self._asked:
                        self._thread = None  # the next watched job starts another
                        return
                    watched = dict(self._asked)
                with contextlib.suppress(InterfaceError, OperationalError):
                    for pk in SynthesisJob.objects.filter(
                        pk__in=list(watched), cancel_requested=True
                    ).values_list("pk", flat=True):
                        watched[pk].set()
        finally:
            connections.close_all()  # this thread's own connection


_cancel_watch = _CancelWatch()


def _run_synthesis(
    state: worker.WorkerState,
    job: SynthesisJob,
    attempt: Attempt,
    request: SynthesisRequest,
    progress: Callable[[int, int], None],
    cancel: dict[str, bool],
    cache: sentence_cache.DiskStore | None,
) -> Any:
    remote = bool(getattr(state.synthesizer.engine(job.engine), "remote", False))
    watch = _cancel_watch.watching(job.pk) if remote else contextlib.nullcontext(lambda: False)
    interactive = job.lane == SynthesisJob.Lane.INTERACTIVE
    if interactive:
        state.host_jobs.note_interactive()  # a batch job beside it keeps to its share (worker.py)
    with state.host_jobs.running(), watch as canceled:  # (host_jobs: synth.hostjobs)
        return state.synthesizer.synthesize(
            request,
            attempt.out_path,
            progress=progress,
            should_cancel=lambda: (
                cancel["requested"]
                or worker.handing_back()
                or canceled()
                or _past_hard_limit_in_a_thread(attempt)
            ),
            # The audio as it is made, for clients streaming the job (webapp/speech/api/streaming.py).
            stream=StreamWriter(stream_path(attempt.out_path), on_grew=lambda: notify.stream_grew(job.id)),
            cache=cache,
        )


def _metrics(
    state: worker.WorkerState, attempt: Attempt, result: Any, rss_before: float, cpu_seconds: float
) -> dict[str, Any]:
    """What the job row keeps about its run (the API shows only the public part)."""
    job = attempt.job
    return {
        "queue_ms": max(0, int((attempt.claimed_at - job.created_at).total_seconds() * 1000)),
        "synth_ms": result.synth_ms,
        "cpu_ms": int(cpu_seconds * 1000),
        "audio_seconds": round(result.duration_seconds, 3),
        "rtf": round(result.rtf, 4),
        "peak_rss_mb": result.peak_rss_mb,
        "peak_gpu_mb": result.peak_gpu_mb,
        "engine": result.engine,
        "device": result.device,
        "worker": state.worker_id,
        "host": state.worker_id.partition(":")[0],
        "pid": state.pid,
        "node": state.node,
        "attempt": job.attempts,
        "claim_token": attempt.token,
        "child_task_no": state.tasks_done + 1,
        "child_rss_before_mb": rss_before,
        "chunks": result.chunks,
        "batch_sizes": result.batch_sizes,  # per sentence, on a batching child; [] elsewhere
        # The verified model directory it ran on (TTS_MODELS_DIR/<engine>/; synth.models), if any.
        **_model_of(state, result.engine),
    }


def _model_of(state: worker.WorkerState, engine: str) -> dict[str, str]:
    info = getattr(state.synthesizer, "model_info", {}).get(engine)
    return {"model": info["model"], "model_checksum": info["checksum"]} if info else {}


def _settle_failure(attempt: Attempt, exc: Exception) -> Outcome:
    """End a run that raised: lost, canceled, timed out, refused by synth, out of storage or memory, a bug.

    The message a tenant sees is ours, never the exception's text; that goes to the log.
    """
    job = attempt.job
    if isinstance(exc, AttemptLost):
        log.warning("job %s: the attempt with token %s lost its claim; stopped", job.id, attempt.token)
        return Outcome("lost")
    if isinstance(exc, Cancelled) and _past_hard_limit_in_a_thread(attempt):
        return _hard_limit_failure(attempt)
    if isinstance(exc, Cancelled) and worker.handing_back():
        # The worker is stopping and its grace ran out: the job waits for another worker.
        handed_back = db_retry(
            lifecycle.requeue_job, job.id, attempt.token, reason="worker stopping", count_attempt=False
        )
        return Outcome("requeued:shutdown" if handed_back else "lost")
    if isinstance(exc, Cancelled):
        canceled = db_retry(lifecycle.finish_canceled, job.id, attempt.token)
        return Outcome("canceled" if canceled else "lost")
    if isinstance(exc, ConsentWithdrawn):
        return _failed(
            attempt, JobFailureCode.CONSENT_REVOKED, "The consent of the voice this job clones was revoked."
        )
    if isinstance(exc, SoftLimitReached):
        message = (
            f"Synthesis needed more than the {attempt.soft:g} s of CPU time allowed "
            f"for {job.text_chars} characters."
        )
        return _failed(attempt, JobFailureCode.TIMEOUT, message)
    if isinstance(exc, SynthError):
        return _failed(attempt, JobFailureCode.of_synth(exc.code), exc.message)
    code = storage_error_code(exc)
    if code is not None:
        log.error("job %s: %s (%s)", job.id, code, exc)
        detail = (
            "The audio storage is full."
            if code is JobFailureCode.DISK_FULL
            else "The audio could not be stored."
        )
        return _failed(attempt, code, f"{detail} Try again later.")
    if is_out_of_memory(exc):
        return Outcome(_out_of_memory(attempt, exc), out_of_memory=True)
    if isinstance(exc, DB_ERRORS):
        # PostgreSQL went away in a read no retry covers (the plan's cache bound, a voice's
        # prompt): not the job's fault. It waits for another attempt, as after a lost worker.
        log.warning("job %s: the database went away mid-run (%s); re-queued", job.id, exc)
        _drop_connections()
        requeued = db_retry(lifecycle.requeue_job, job.id, attempt.token, reason="database unreachable")
        return Outcome("requeued:database" if requeued else "lost")
    log.exception("job %s failed unexpectedly", job.id)
    return _failed(
        attempt, JobFailureCode.SYNTHESIS_FAILED, "Synthesis failed unexpectedly; try again later."
    )


def _failed(attempt: Attempt, code: JobFailureCode, message: str) -> Outcome:
    ended = db_retry(lifecycle.fail_job, attempt.job.id, code, message, token=attempt.token)
    return Outcome(f"failed:{code}" if ended else "lost")


def _out_of_memory(attempt: Attempt, exc: BaseException) -> str:
    """Re-queue once (a fresh child may well manage), then give up with ``resource_exhausted``."""
    job = attempt.job
    log.error("job %s ran out of memory: %s", job.id, exc)
    if job.oom_retries < settings.TTS_JOB_OOM_RETRIES:
        if db_retry(lifecycle.requeue_job, job.id, attempt.token, reason="out of memory", oom=True):
            return "requeued:oom"
    message = "The worker ran out of memory on this job, also after a retry on a fresh worker."
    return _failed(attempt, JobFailureCode.RESOURCE_EXHAUSTED, message).name
