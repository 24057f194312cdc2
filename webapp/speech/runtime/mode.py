"""How this worker's children run jobs: one at a time, or several at once (batching)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings


def batching_enabled() -> bool:
    """Whether this worker's children run several jobs at once (CPU workers: never by default)."""
    return settings.TTS_WORKER_PIPER_RUNTIME == "torch" and settings.TTS_WORKER_BATCH_JOBS > 1


def cpu_clock() -> Callable[[], float]:
    """The clock of a job's soft limit (CPU seconds) in this child.

    A batching child runs several jobs in one process, so its process CPU time
    is all of theirs: each job counts its own thread's CPU time plus its share
    of every batch its sentences were in (synth.batching.thread_cpu_time).
    """
    if not batching_enabled():
        return time.process_time
    from synth.batching import thread_cpu_time  # torch's batcher: loaded only on a batching child

    return thread_cpu_time
