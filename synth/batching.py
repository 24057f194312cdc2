"""Sentences of concurrent jobs, synthesised together: the batcher of a GPU worker child.

Each job runs in its own thread and asks for its sentences one at a time
(:meth:`SentenceBatcher.submit`, which blocks until its audio is ready). One
batcher thread collects what is waiting and makes one batched call. A batch
closes as soon as every job that is synthesising waits on it, when it holds
``max_items`` sentences, or ``wait_s`` after its first sentence arrived,
whichever comes first. Every caller gets its own result or its own exception;
jobs join and leave at sentence boundaries. docs/gpu.md, "Execution model for
GPU batching".

:func:`recording` collects, for the calling thread (one job), the size of every
batch its sentences were in and the largest peak memory those batches reported;
:func:`thread_cpu_time` is the thread's CPU time plus its share of the batches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")

# The batched call: one result (or the exception of that item alone) per payload, in
# order, and the peak memory (MiB) of the call, or None when it has none to tell.
BatchFn = Callable[[list[P]], tuple[list["R | BaseException"], "float | None"]]


@dataclass
class BatchRecord:
    """What one job's sentences met in the batcher."""

    sizes: list[int] = field(default_factory=list)
    peak_mb: float | None = None

    def add(self, size: int, peak_mb: float | None) -> None:
        self.sizes.append(size)
        if peak_mb is not None:
            self.peak_mb = peak_mb if self.peak_mb is None else max(self.peak_mb, peak_mb)


_local = threading.local()


def thread_cpu_time() -> float:
    """This thread's CPU seconds, plus an equal share of each batched call its sentences were in.

    The batched call runs in the batcher's thread; without the share, a job
    would seem to cost nothing (and its process's CPU time counts every job).
    """
    return time.thread_time() + float(getattr(_local, "batch_cpu", 0.0))


@contextmanager
def recording() -> Iterator[BatchRecord]:
    """Record the batches this thread's sentences go through while the block runs."""
    record = BatchRecord()
    previous = getattr(_local, "record", None)
    _local.record = record
    try:
        yield record
    finally:
        _local.record = previous


@dataclass
class _Item(Generic[P]):
    payload: P
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    size: int = 0
    peak_mb: float | None = None
    cpu_share: float = 0.0


class SentenceBatcher(Generic[P, R]):
    """Groups the sentences that concurrent jobs wait on into one call of ``run``."""

    def __init__(
        self, run: BatchFn[P, R], max_items: int, wait_s: float, name: str = "sentence-batcher"
    ) -> None:
        if max_items < 1:
            raise ValueError("a batch holds at least one sentence")
        self._run = run
        self.max_items = max_items
        self.wait_s = max(0.0, wait_s)
        self.name = name
        self._cond = threading.Condition()
        self._waiting: list[_Item[P]] = []
        self._members = 0
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextmanager
    def member(self) -> Iterator[None]:
        """A job that is synthesising: while it is one, a batch may wait for its next sentence."""
        with self._cond:
            self._members += 1
        try:
            yield
        finally:
            with self._cond:
                self._members -= 1
                self._cond.notify_all()

    def submit(self, payload: P) -> R:
        """This sentence's result, once the batch it joined has run; raises its own error."""
        item: _Item[P] = _Item(payload)
        with self._cond:
            self._start_thread()
            self._waiting.append(item)
            self._cond.notify_all()
        item.done.wait()
        _local.batch_cpu = getattr(_local, "batch_cpu", 0.0) + item.cpu_share
        record: BatchRecord | None = getattr(_local, "record", None)
        if record is not None:
            record.add(item.size, item.peak_mb)
        if item.error is not None:
            raise item.error
        return item.result  # type: ignore[no-any-return]

    def _start_thread(self) -> None:
        # Started on first use, in the process that uses it (a forked child has no copy of the thread).
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            self._execute(self._next_batch())

    def _next_batch(self) -> list[_Item[P]]:
        with self._cond:
            while not self._waiting:
                self._cond.wait()
            closes = time.monotonic() + self.wait_s
            # No point waiting for more sentences than there are jobs synthesising.
            while len(self._waiting) < min(self.max_items, max(self._members, 1)):
                left = closes - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._waiting = self._waiting[: self.max_items], self._waiting[self.max_items :]
            return batch

    def _execute(self, batch: list[_Item[P]]) -> None:
        peak: float | None = None
        cpu = time.thread_time()
        try:
            results, peak = self._run([item.payload for item in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batched call gave {len(results)} results for {len(batch)} sentences")
        except BaseException as exc:  # the call failed as a whole: every caller in it gets the error
            if len(batch) > 1 and _out_of_memory(exc):
                # The batch, not a sentence, may be what did not fit: each is tried alone before
                # its job is given the error (a job retries an out-of-memory error only once).
                log.warning("batched call of %d sentences ran out of memory; each is tried alone", len(batch))
                for item in batch:
                    self._execute([item])
                return
            log.exception("batched call of %d sentences failed", len(batch))
            results = [exc] * len(batch)
        share = (time.thread_time() - cpu) / len(batch)
        for item, result in zip(batch, results, strict=True):
            item.size, item.peak_mb, item.cpu_share = len(batch), peak, share
            if isinstance(result, BaseException):
                item.error = result
            else:
                item.result = result
            item.done.set()


def _out_of_memory(exc: BaseException) -> bool:
    """Host MemoryError or torch's (CUDA) OutOfMemoryError, by name: torch is not imported here."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


__all__ = ["BatchRecord", "SentenceBatcher", "recording", "thread_cpu_time"]
