"""Faults the reliability tests inject into worker children (webapp/speech/runtime/hooks.py).

Test workers run with ``TTS_WORKER_HOOKS=tests.faults``; each fault is off unless
its ``TTS_FAULT_*`` environment variable names a marker.

A job whose text contains the marker kills its child mid-write (after its
first sentence), runs out of memory, hangs (in Python, or in native code where
no alarm reaches it), or stops (SIGSTOP) or dies between its file's rename and its commit;
on a batching child, a sentence containing its marker fails in its batch, and
a batched call holding a sentence with the out-of-memory marker runs out of CUDA
memory as a whole (the sentence alone fits).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from typing import Any

from django.conf import settings
from django.db import OperationalError

from synth.errors import SynthError
from webapp.speech.models import SynthesisJob

log = logging.getLogger(__name__)


def before_synthesis(job: SynthesisJob) -> None:
    """Before synthesis: lose the database (first attempt only); on every attempt, run out of
    memory or hang."""
    gone = os.environ.get("TTS_FAULT_DB_GONE_MARKER", "")
    if gone and gone in job.text and job.attempts == 1:
        # What a read with no retry of its own raises when PostgreSQL restarts under it.
        raise OperationalError("fault injection: server closed the connection unexpectedly")
    oom = os.environ.get("TTS_FAULT_OOM_MARKER", "")
    if oom and oom in job.text:
        raise MemoryError("fault injection: simulated out-of-memory")
    hang = os.environ.get("TTS_FAULT_HANG_MARKER", "")
    if hang and hang in job.text:
        log.error("fault injection: job %s hangs", job.id)
        while True:  # only the hard limit ends this
            time.sleep(1)
    native = os.environ.get("TTS_FAULT_NATIVE_HANG_MARKER", "")
    if native and native in job.text:
        hang_in_native_code(job)


def hang_in_native_code(job: SynthesisJob) -> None:
    """Stuck in C with SIGALRM blocked, as a runtime that ignores the alarm: no Python runs here again."""
    log.error("fault injection: job %s hangs in native code (libc pause, SIGALRM blocked)", job.id)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    libc = ctypes.CDLL(None)
    while True:  # pause() returns only for a signal with a handler: it pauses again
        libc.pause()


def after_progress(job: SynthesisJob, done: int, total: int) -> None:
    """The child burns CPU after each sentence (an engine far slower than the limit allows), or dies
    with a sentence in its partial and stream files (first claim and every retry)."""
    burn = os.environ.get("TTS_FAULT_BURN_CPU_MARKER", "")
    if burn and burn in job.text and 0 < done < total:
        until = time.process_time() + float(os.environ.get("TTS_FAULT_BURN_CPU_SECONDS", "1"))
        while time.process_time() < until:
            pass
    once = os.environ.get("TTS_FAULT_CRASH_ONCE_MARKER", "")
    if once and once in job.text and done >= 1 and job.attempts == 1:
        # The first attempt only: its sentence is in the stream file (a reader may have sent it), then it dies.
        log.error(
            "fault injection: job %s kills its worker child after a sentence, first attempt only", job.id
        )
        os._exit(70)
    crash = os.environ.get("TTS_FAULT_CRASH_MARKER", "")
    if crash and crash in job.text and done >= 1:
        record = os.environ.get("TTS_FAULT_CRASH_RECORD", "")
        if record:
            # What the test asserts the death overlapped: this attempt's own files, being written.
            folder = os.path.join(str(settings.MEDIA_ROOT), "audio", str(job.organization_id))
            mine = [f for f in os.listdir(folder) if f.startswith(f".{job.id}.{job.claim_token}.")]
            with open(record, "a") as fh:
                fh.write(f"{job.id} {job.attempts} {len(mine)}\n")
        log.error("fault injection: job %s kills its worker child mid-write", job.id)
        os._exit(70)


def before_commit(job: SynthesisJob) -> None:
    """Test-only faults between the file's rename and the commit, on the job's first claim only."""
    if job.attempts != 1:
        return
    pause = os.environ.get("TTS_FAULT_PAUSE_BEFORE_COMMIT_MARKER", "")
    if pause and pause in job.text:
        log.error("fault injection: job %s stops its child before the commit", job.id)
        os.kill(os.getpid(), signal.SIGSTOP)
    crash = os.environ.get("TTS_FAULT_CRASH_BEFORE_COMMIT_MARKER", "")
    if crash and crash in job.text:
        log.error("fault injection: job %s kills its child before the commit", job.id)
        os._exit(70)


def _lose_claim_replies(marker: str) -> None:
    """A claim of a marked job commits, and its reply is lost once (the connection drops after COMMIT)."""
    from django.db import OperationalError

    from webapp.speech import lifecycle

    lost: set[str] = set()

    def losing(real: Any) -> Any:
        def claim(*args: Any, **kwargs: Any) -> Any:
            job = real(*args, **kwargs)  # committed: the row names this child as owner now
            if job is not None and marker in job.text and str(job.id) not in lost:
                lost.add(str(job.id))
                record = os.environ.get("TTS_FAULT_LOST_CLAIM_REPLY_RECORD", "")
                if record:
                    with open(record, "a") as fh:
                        fh.write(f"{job.id} {job.attempts} {job.worker} {job.claim_token}\n")
                log.error("fault injection: the reply to job %s's claim is lost after its COMMIT", job.id)
                raise OperationalError("server closed the connection unexpectedly (fault injection)")
            return job

        return claim

    lifecycle.claim_job = losing(lifecycle.claim_job)  # type: ignore[assignment]
    lifecycle.claim_next = losing(lifecycle.claim_next)  # type: ignore[assignment]


def after_load(synthesizer: Any) -> None:
    """Claims whose replies are lost; on a batching child a sentence that fails in its batched call, alone.

    The batch runs as it would; then the marked sentence's audio is replaced by
    the error the engine gives a sentence that fails on its own.
    """
    lost_reply = os.environ.get("TTS_FAULT_LOST_CLAIM_REPLY_MARKER", "")
    if lost_reply:
        _lose_claim_replies(lost_reply)
    marker = os.environ.get("TTS_FAULT_SENTENCE_MARKER", "")
    oom = os.environ.get("TTS_FAULT_BATCH_OOM_MARKER", "")
    if not (marker or oom) or "piper" not in synthesizer.engine_names:
        return
    engine = synthesizer.engine("piper")
    if getattr(engine, "batcher", None) is None:
        return
    real = engine.synthesize_batch

    def synthesize_batch(requests: list[Any], *args: Any, **kwargs: Any) -> Any:
        if oom and len(requests) > 1 and any(oom in text for text, _params in requests):
            import torch

            record = os.environ.get("TTS_FAULT_BATCH_OOM_RECORD", "")
            if record:
                with open(record, "a") as fh:
                    fh.write(f"{len(requests)}\n")
            log.error(
                "fault injection: a batched call of %d sentences runs out of CUDA memory", len(requests)
            )
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fault injection)")
        outcome = real(requests, *args, **kwargs)
        if not marker:
            return outcome
        for i, (text, _params) in enumerate(requests):
            if marker in text:
                log.error("fault injection: a sentence of a batch of %d fails", len(requests))
                outcome.results[i] = SynthError("synthesis failed: fault injection", code="synthesis_failed")
        return outcome

    engine.synthesize_batch = synthesize_batch


# A job whose text holds this marker finds the disk full as it writes its sentence cache entries.
CACHE_FULL_MARKER = os.environ.get("TTS_FAULT_CACHE_FULL_MARKER", "Cachefullfaultmarker")


def before_cache_write(job: SynthesisJob) -> None:
    """ENOSPC in the middle of a sentence cache write (the entry's temp file is open)."""
    if CACHE_FULL_MARKER and CACHE_FULL_MARKER in job.text:
        log.error("fault injection: job %s finds the disk full writing its sentence cache", job.id)
        raise OSError(28, "No space left on device (fault injection)")
