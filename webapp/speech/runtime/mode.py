"""How this worker's children run jobs: one at a time, or several at once (batching, relaying)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings


def batching_enabled() -> bool:
    """Whether this worker's children run several jobs at once (CPU workers: never by default)."""
    return settings.TTS_WORKER_PIPER_RUNTIME == "torch" and settings.TTS_WORKER_BATCH_JOBS > 1


def relays(engine: str, models: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether ``engine``'s model runs upstream (synth/engines/remote.py): a job of it waits on
    the network, not on this child's CPU, so one child relays many at once, each in a thread."""
    return bool((models.get(engine) or {}).get("remote"))


def jobs_at_once(engine: str, models: Mapping[str, Mapping[str, Any]]) -> int:
    """The jobs of ``engine`` one child of this worker runs at once: its job slots.

    A remote model's: its ``concurrent_jobs`` (the models file's ``jobs_per_process``). Others:
    one unless the child batches; then TTS_WORKER_BATCH_JOBS, but no more than the loaded
    model runs at once (its ``concurrent_jobs`` capability: eSpeak's one on a batching GPU
    worker, a heavy model with a batch-1 cache one).
    """
    model = models.get(engine) or {}
    if relays(engine, models):
        return max(1, int(model.get("concurrent_jobs") or 1))
    if not batching_enabled():
        return 1
    return max(1, min(settings.TTS_WORKER_BATCH_JOBS, int(model.get("concurrent_jobs") or 1)))


def cpu_clock(engine: str, models: Mapping[str, Mapping[str, Any]]) -> Callable[[], float]:
    """The clock of a job's soft limit (CPU seconds) in this child.

    A child running several jobs in one process has the process CPU time of all of
    them: a relayed job counts its own thread's; a batching child's job its own
    thread's plus its share of every batch its sentences were in
    (synth.batching.thread_cpu_time).
    """
    if relays(engine, models):
        return time.thread_time
    if not batching_enabled():
        return time.process_time
    from synth.batching import thread_cpu_time  # torch's batcher: loaded only on a batching child

    return thread_cpu_time
