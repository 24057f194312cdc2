"""Test-only faults for tests/reliability: each is off unless its TTS_FAULT_* setting names a marker.

A job whose text contains the marker kills its child, runs out of memory,
hangs, or stops (SIGSTOP) or dies between its file's rename and its commit.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from django.conf import settings

from webapp.speech.models import SynthesisJob

log = logging.getLogger(__name__)


def before_synthesis(job: SynthesisJob) -> None:
    """Before synthesis, on every attempt: kill the child, run out of memory, or hang."""
    crash = settings.TTS_FAULT_CRASH_MARKER
    if crash and crash in job.text:
        log.error("fault injection: job %s kills its worker child", job.id)
        os._exit(70)
    oom = settings.TTS_FAULT_OOM_MARKER
    if oom and oom in job.text:
        raise MemoryError("fault injection: simulated out-of-memory")
    hang = settings.TTS_FAULT_HANG_MARKER
    if hang and hang in job.text:
        log.error("fault injection: job %s hangs", job.id)
        while True:  # only the hard limit ends this
            time.sleep(1)


def before_commit(job: SynthesisJob) -> None:
    """Test-only faults between the file's rename and the commit, on the job's first claim only."""
    if job.claim_token != 1:
        return
    pause = settings.TTS_FAULT_PAUSE_BEFORE_COMMIT_MARKER
    if pause and pause in job.text:
        log.error("fault injection: job %s stops its child before the commit", job.id)
        os.kill(os.getpid(), signal.SIGSTOP)
    crash = settings.TTS_FAULT_CRASH_BEFORE_COMMIT_MARKER
    if crash and crash in job.text:
        log.error("fault injection: job %s kills its child before the commit", job.id)
        os._exit(70)
