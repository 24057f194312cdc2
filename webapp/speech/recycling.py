"""When a worker child should be replaced, and how it leaves cleanly.

Celery's own ``worker_max_tasks_per_child`` / ``worker_max_memory_per_child``
cover task count and RSS as billiard sees it. This module adds the checks an
operator of a model server cares about, evaluated after every task:

- RSS over ``TTS_WORKER_MAX_RSS_MB``;
- GPU memory over ``TTS_WORKER_MAX_GPU_MB`` (read through an injectable reader:
  torch's current reservation when torch is loaded with CUDA, else NVML's
  per-process figure, else nothing);
- age over ``TTS_WORKER_MAX_AGE_SECONDS``;
- degradation: the rolling median real-time factor of an engine above the
  child's own baseline for that engine by ``TTS_WORKER_RTF_DRIFT_FACTOR``;
- an out-of-memory error during the task.

How the child leaves: billiard's worker loop checks ``mem_rss()`` against
``max_memory_per_child`` right after it has handed the task's result to the
parent, and returns ``EX_RECYCLE`` when it is over: the parent treats that as
a normal recycle and forks a fresh child. :func:`install_exit_hook` wraps that
reading so it reports "over the limit" once a recycle was requested, which
ends the child at exactly that safe point (result delivered, message acked,
no next task taken). Raising SystemExit from a task instead would be re-raised
in the parent by Celery's request handler, and killing ourselves would be a
lost worker. Counts and reasons are kept per worker node in Redis so they
survive the child (:func:`record_recycle`, read by the heartbeat).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

GpuMemoryReader = Callable[[], "float | None"]

NODE_KEY_PREFIX = "tts:worker-node:"
NODE_EVENTS_PREFIX = "tts:worker-events:"
NODE_KEY_TTL = 7 * 24 * 3600
EVENTS_KEPT = 200


# ----------------------------------------------------------------------------- readings


def read_rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def _device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0


def read_gpu_memory_mb(device: str | None = None) -> float | None:
    """This process's GPU memory in MiB now, or None on CPU or when nothing can tell.

    torch first (``memory_reserved``: what the caching allocator holds, which
    is what grows), but only when torch is already imported and CUDA already
    initialised, so reading never initialises CUDA. Otherwise NVML's
    per-process usage (onnxruntime's CUDA provider shows up there).
    """
    device = device if device is not None else str(getattr(settings, "TTS_WORKER_DEVICE", "cpu"))
    if device == "cpu":
        return None
    index = _device_index(device)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                return float(torch.cuda.memory_reserved(index)) / 2**20
        except Exception:  # noqa: S110 - a broken CUDA runtime: try NVML
            pass
    return _nvml_process_mb(index, os.getpid())


def _nvml_process_mb(index: int, pid: int) -> float | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used = 0.0
        seen = False
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in getattr(pynvml, getter)(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    used += float(proc.usedGpuMemory) / 2**20
                    seen = True
        # Not listed: this process holds no context on that GPU (yet).
        return used if seen else 0.0
    except Exception:
        return None


def load_gpu_reader(path: str | None = None) -> GpuMemoryReader:
    """The configured reader (``module:function`` or ``module.function``)."""
    path = path or settings.TTS_WORKER_GPU_MEMORY_READER
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    fn = getattr(importlib.import_module(module_name), attr)
    return fn  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- policy


@dataclass
class RecyclePolicy:
    max_rss_mb: float = 0.0  # 0 = no limit
    max_gpu_mb: float = 0.0
    max_age_seconds: float = 0.0
    rtf_drift_factor: float = 0.0
    rtf_baseline_tasks: int = 5
    rtf_window: int = 10

    @classmethod
    def from_settings(cls) -> RecyclePolicy:
        return cls(
            max_rss_mb=settings.TTS_WORKER_MAX_RSS_MB,
            max_gpu_mb=settings.TTS_WORKER_MAX_GPU_MB,
            max_age_seconds=settings.TTS_WORKER_MAX_AGE_SECONDS,
            rtf_drift_factor=settings.TTS_WORKER_RTF_DRIFT_FACTOR,
            rtf_baseline_tasks=max(1, settings.TTS_WORKER_RTF_BASELINE_TASKS),
            rtf_window=max(1, settings.TTS_WORKER_RTF_WINDOW),
        )


@dataclass
class RtfTracker:
    """Per engine: a baseline (median RTF of the child's first tasks) and a rolling window."""

    baseline_tasks: int
    window: int
    baselines: dict[str, float] = field(default_factory=dict)
    _first: dict[str, list[float]] = field(default_factory=dict)
    _recent: dict[str, deque[float]] = field(default_factory=dict)

    def add(self, engine: str, rtf: float) -> None:
        if not rtf or rtf <= 0:
            return
        if engine not in self.baselines:
            first = self._first.setdefault(engine, [])
            first.append(rtf)
            if len(first) >= self.baseline_tasks:
                self.baselines[engine] = statistics.median(first)
            return
        self._recent.setdefault(engine, deque(maxlen=self.window)).append(rtf)

    def rolling(self, engine: str) -> float | None:
        recent = self._recent.get(engine)
        if recent:
            return statistics.median(recent)
        first = self._first.get(engine)
        return statistics.median(first) if first else None

    def drifted(self, factor: float) -> str | None:
        """The engine whose full rolling window is ``factor`` x slower than its baseline."""
        if factor <= 0:
            return None
        for engine, base in self.baselines.items():
            recent = self._recent.get(engine)
            if recent is None or len(recent) < self.window or base <= 0:
                continue
            if statistics.median(recent) > factor * base:
                return engine
        return None

    def summary(self) -> dict[str, dict[str, float | None]]:
        engines = set(self._first) | set(self._recent)
        return {
            e: {"baseline": _r(self.baselines.get(e)), "rolling": _r(self.rolling(e))}
            for e in sorted(engines)
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass
class ChildHealth:
    """What one worker child knows about itself, and the decision to replace it."""

    policy: RecyclePolicy
    gpu_reader: GpuMemoryReader | None = None
    started_at: float = field(default_factory=time.time)
    rtf: RtfTracker = field(init=False)
    recycle_reason: str | None = None
    last_rss_mb: float = 0.0
    last_gpu_mb: float | None = None

    def __post_init__(self) -> None:
        self.rtf = RtfTracker(self.policy.rtf_baseline_tasks, self.policy.rtf_window)

    def read_gpu(self) -> float | None:
        if self.gpu_reader is None:
            return None
        try:
            value = self.gpu_reader()
        except Exception as exc:  # a reader must never break a task
            log.warning("GPU memory reader failed: %s", exc)
            return None
        return None if value is None else float(value)

    def check(self, now: float | None = None, rss_mb: float | None = None) -> str | None:
        """After a task: the reason to recycle now, or None. Remembers the readings."""
        now = time.time() if now is None else now
        p = self.policy
        self.last_rss_mb = read_rss_mb() if rss_mb is None else rss_mb
        self.last_gpu_mb = self.read_gpu()
        if self.recycle_reason:
            return self.recycle_reason
        reason: str | None = None
        if p.max_rss_mb and self.last_rss_mb > p.max_rss_mb:
            reason = f"rss {self.last_rss_mb:.0f} MiB over {p.max_rss_mb:.0f} MiB"
        elif p.max_gpu_mb and self.last_gpu_mb is not None and self.last_gpu_mb > p.max_gpu_mb:
            reason = f"gpu_memory {self.last_gpu_mb:.0f} MiB over {p.max_gpu_mb:.0f} MiB"
        elif p.max_age_seconds and now - self.started_at > p.max_age_seconds:
            reason = f"age {now - self.started_at:.0f} s over {p.max_age_seconds:.0f} s"
        else:
            engine = self.rtf.drifted(p.rtf_drift_factor)
            if engine is not None:
                base = self.rtf.baselines[engine]
                reason = (
                    f"rtf_drift {engine} rolling {self.rtf.rolling(engine):.4f} over "
                    f"{p.rtf_drift_factor:g} x baseline {base:.4f}"
                )
        if reason:
            self.recycle_reason = reason
        return reason


def reason_kind(reason: str) -> str:
    """``"rss 1600 MiB over 1500 MiB"`` -> ``"rss"``: the counter a reason is filed under."""
    return reason.split(" ", 1)[0]


# ----------------------------------------------------------------------------- leaving cleanly

_exit_requested: list[str] = []


def request_exit(reason: str) -> None:
    """Make this child leave after the current task (see the module docstring)."""
    if not _exit_requested:
        _exit_requested.append(reason)
        log.warning("worker child %d will be recycled after this task: %s", os.getpid(), reason)


def exit_requested() -> str | None:
    return _exit_requested[0] if _exit_requested else None


def install_exit_hook() -> bool:
    """Wrap billiard's after-task memory reading in this child. Returns False if it cannot."""
    try:
        import billiard.pool as pool
    except ImportError:
        return False
    original = getattr(pool, "mem_rss", None)
    if original is None or getattr(original, "_tts_hook", False):
        return original is not None

    def mem_rss() -> int:
        if _exit_requested:
            # Over any limit: billiard returns EX_RECYCLE and the parent forks a fresh child.
            return 2**62
        return int(original())

    mem_rss._tts_hook = True  # type: ignore[attr-defined]
    pool.mem_rss = mem_rss  # type: ignore[attr-defined]
    return True


# ----------------------------------------------------------------------------- per-node records


def node_id() -> str:
    """The worker node a child belongs to: host and the pid of the Celery parent."""
    import socket

    return f"{socket.gethostname()}:{os.getppid()}"


def record_event(client: Any, node: str, event: dict[str, Any]) -> None:
    key = NODE_EVENTS_PREFIX + node
    pipe = client.pipeline()
    pipe.rpush(key, json.dumps(event))
    pipe.ltrim(key, -EVENTS_KEPT, -1)
    pipe.expire(key, NODE_KEY_TTL)
    pipe.execute()


def record_recycle(client: Any, node: str, reason: str, pid: int, tasks_done: int) -> None:
    """Count a recycle under the node, by kind, so it outlives the child that left."""
    key = NODE_KEY_PREFIX + node
    pipe = client.pipeline()
    pipe.hincrby(key, "recycles", 1)
    pipe.hincrby(key, "reason:" + reason_kind(reason), 1)
    pipe.hset(key, "last_reason", reason)
    pipe.expire(key, NODE_KEY_TTL)
    pipe.execute()
    record_event(
        client,
        node,
        {"event": "recycle", "pid": pid, "reason": reason, "tasks": tasks_done, "at": time.time()},
    )


def node_stats(client: Any, node: str) -> dict[str, Any]:
    raw = client.hgetall(NODE_KEY_PREFIX + node) or {}
    reasons = {k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("reason:")}
    return {
        "recycles": int(raw.get("recycles", 0)),
        "recycle_reasons": reasons,
        "last_recycle_reason": raw.get("last_reason", ""),
        "load_failures": int(raw.get("load_failures", 0)),
    }


def node_events(client: Any, node: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.lrange(NODE_EVENTS_PREFIX + node, 0, -1)]


def load_failure_streak(client: Any, node: str, change: int | None) -> int:
    """Consecutive model-load failures of the node: +1, reset (0) or read (None)."""
    key = NODE_KEY_PREFIX + node
    if change is None:
        return int(client.hget(key, "load_failures") or 0)
    if change == 0:
        client.hset(key, "load_failures", 0)
        return 0
    value = int(client.hincrby(key, "load_failures", change))
    client.expire(key, NODE_KEY_TTL)
    return value


def backoff_delay(failures: int, base: float, cap: float) -> float:
    """Seconds to wait before load attempt number ``failures + 1``: base, 2 base, 4 base ... cap."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * (2 ** (failures - 1))))
