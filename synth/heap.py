"""The C heap of a process that runs inference on the CPU (glibc only; elsewhere a no-op).

Every VITS inference allocates and frees ~100-300 MB of intermediate tensors
(onnxruntime's own arena is off: it would keep the largest sentence's worth for
the life of the process). By default glibc serves blocks that large with fresh
``mmap`` calls and returns them on free, so each sentence faulted in every page
again: measured on the 2-core machine, 30-40 k minor page faults and ~0.1 s of
system time per 5-second sentence, a third of its wall time.

So while a job runs, the heap keeps what it frees (:func:`keep_freed_memory`):
blocks up to 32 MiB come from the heap, and its top is not trimmed on free. A
job's later sentences reuse pages already mapped. What the heap holds is given
back to the OS every :data:`TRIM_EVERY` sentences (it cannot fragment without
bound over a long text) and once the process has been idle for
:data:`IDLE_TRIM_SECONDS` after a job, so an idle worker child is back at its
baseline and a steady stream of short jobs pays no page faults
(docs/decisions.md).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

TRIM_EVERY = 8  # sentences
IDLE_TRIM_SECONDS = 1.0
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 2**30
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3

_LIBC: Any = None
_state = threading.Lock()
_configured = False
_idle_timer: threading.Timer | None = None
_sentences = 0
_active = 0  # jobs running in this process


def _libc() -> Any:
    """glibc, or False where the C library is another (no trim, no tuning)."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - not glibc: no trim
            _LIBC.mallopt  # noqa: B018
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def release_free_heap() -> None:
    """Give the heap's free memory back to the OS now."""
    libc = _libc()
    if libc:
        libc.malloc_trim(0)


def keep_freed_memory() -> bool:
    """Let this process's heap keep freed inference buffers for reuse (once per process).

    True when the tuning is in place. Process-wide: call it only in a process
    that runs inference (a worker child, a benchmark), never in the web tier.
    """
    global _configured
    libc = _libc()
    with _state:
        if libc and not _configured:
            _configured = bool(
                libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            )
        return _configured


def job_started() -> None:
    """A job begins: the heap it will reuse stays mapped (a pending idle trim is called off)."""
    global _idle_timer, _active
    with _state:
        _active += 1
        if _idle_timer is not None:
            _idle_timer.cancel()
            _idle_timer = None


def sentence_done() -> None:
    """After each sentence: trim every TRIM_EVERY sentences (untuned: after every sentence)."""
    global _sentences
    with _state:
        _sentences += 1
        due = not _configured or _sentences % TRIM_EVERY == 0
    if due:
        release_free_heap()


def job_ended() -> None:
    """A job is over: trim once the process has stayed idle for IDLE_TRIM_SECONDS."""
    global _idle_timer, _active
    with _state:
        _active = max(0, _active - 1)
        if not _configured or _active:
            return
        if _idle_timer is not None:
            _idle_timer.cancel()
        _idle_timer = threading.Timer(IDLE_TRIM_SECONDS, release_free_heap)
        _idle_timer.daemon = True  # never holds up the process's exit
        _idle_timer.start()
