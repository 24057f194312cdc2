"""When a worker child should be replaced, and how it leaves cleanly.

Each child leaves after a task count of its own, drawn at or up to 15 % below
``TTS_WORKER_MAX_TASKS_PER_CHILD`` (:data:`TASK_JITTER`) and in its node's
turn (:func:`take_turn`); Celery's ``worker_max_tasks_per_child``, ten times
the setting, is only a backstop. This
module adds the checks an operator of a model server cares about, evaluated
after every task:

- RSS over ``TTS_WORKER_MAX_RSS_MB`` (or Celery's ``worker_max_memory_per_child``
  when that is lower);
- GPU memory over ``TTS_WORKER_MAX_GPU_MB`` (read through an injectable reader,
  by default ``synth.telemetry.read_gpu_memory_mb``'s current figure);
- age over ``TTS_WORKER_MAX_AGE_SECONDS``;
- degradation: the rolling median CPU seconds per character of an engine
  above the child's own baseline for that engine by
  ``TTS_WORKER_RTF_DRIFT_FACTOR``. CPU time, not wall time: on a busy host
  (other children, other services) wall time per character doubles while the
  child is as healthy as ever, and replacing it would not make it faster;
- an out-of-memory error during the task.

Memory limits count from the child's own baseline (its reading after warm-up,
:meth:`ChildHealth.set_baseline`): memory a child was born with would be in
its replacement too. Age limits are jittered per child (+-15 %), so children
started together leave at different times. A recycle decided before
``TTS_WORKER_MIN_TASKS_BEFORE_RECYCLE`` tasks is held back and logged as an
error instead of looping (out-of-memory and the task count excepted).

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
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from synth import telemetry
from synth.telemetry import read_rss_mb
from webapp import private_apis
from webapp.speech import owners

log = logging.getLogger(__name__)

GpuMemoryReader = Callable[[], "float | None"]

NODE_KEY_PREFIX = "tts:worker-node:"
NODE_EVENTS_PREFIX = "tts:worker-events:"
NODE_KEY_TTL = 7 * 24 * 3600
EVENTS_KEPT = 200


# ----------------------------------------------------------------------------- readings


def read_gpu_memory_mb(device: str | None = None) -> float | None:
    """What this child holds on its GPU now (MiB), or None on CPU: the default recycle reader."""
    device = device if device is not None else str(getattr(settings, "TTS_WORKER_DEVICE", "cpu"))
    return telemetry.read_gpu_memory_mb(device, peak=False)


def load_gpu_reader(path: str | None = None) -> GpuMemoryReader:
    """The configured reader (``module:function`` or ``module.function``)."""
    path = path or settings.TTS_WORKER_GPU_MEMORY_READER
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    fn = getattr(importlib.import_module(module_name), attr)
    return fn  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- policy

# Memory a child was born with is no reason to replace it (a fresh child would
# have it too): a memory limit counts only once the child has grown this much
# over its own baseline, the reading after its warm-up.
MEMORY_GROWTH = 0.10
# Children started together must not all leave together: each child's age
# limit is drawn from limit x (1 +- AGE_JITTER).
AGE_JITTER = 0.15
# Nor at the same task count: children that share a queue's jobs evenly would
# reach one count together and leave the node without a serving child while
# every replacement loads. Each child's count limit is drawn from
# [limit x (1 - TASK_JITTER), limit], and a child leaves for a reason that can
# wait only in its node's turn (take_turn).
TASK_JITTER = 0.15
# Reasons that can wait for the node's turn; memory and out-of-memory cannot.
CAN_WAIT = ("max_tasks", "age", "rtf_drift")
# A sibling in one of these is on its way out or not serving yet. One that cannot load
# its model (backing off, or failed) is not serving either: a child that left then would
# leave the node empty, its own replacement failing as the sibling does.
CANNOT_LOAD_STATES = ("backoff", "load_failed")
REPLACING_STATES = ("recycling", "starting", "loading", "warming_up", *CANNOT_LOAD_STATES)
TURN_KEY_PREFIX = "tts:recycle-turn:"
# Held from a child's leaving until a child of the node reports ready (end_turn);
# a replacement that never does frees it after this. Also the longest a child
# waits for the turn before it leaves anyway.
TURN_TTL = 120


@dataclass
class RecyclePolicy:
    max_rss_mb: float = 0.0  # 0 = no limit
    max_gpu_mb: float = 0.0
    max_age_seconds: float = 0.0
    rtf_drift_factor: float = 0.0
    rtf_baseline_tasks: int = 5
    rtf_window: int = 10
    # A recycle decided before this many tasks is held back (logged as an error):
    # replacing the child would not help, and doing it anyway is a restart loop.
    min_tasks: int = 0
    # Age limit jitter, a fraction of the limit (the worker uses AGE_JITTER).
    age_jitter: float = 0.0
    max_tasks: int = 0  # 0 = no limit
    task_jitter: float = 0.0  # the worker uses TASK_JITTER

    @classmethod
    def from_settings(cls) -> RecyclePolicy:
        celery_mb = settings.CELERY_WORKER_MAX_MEMORY_PER_CHILD / 1024
        rss_limits = [x for x in (settings.TTS_WORKER_MAX_RSS_MB, celery_mb) if x > 0]
        return cls(
            max_rss_mb=min(rss_limits, default=0.0),
            max_gpu_mb=settings.TTS_WORKER_MAX_GPU_MB,
            max_age_seconds=settings.TTS_WORKER_MAX_AGE_SECONDS,
            rtf_drift_factor=settings.TTS_WORKER_RTF_DRIFT_FACTOR,
            rtf_baseline_tasks=max(1, settings.TTS_WORKER_RTF_BASELINE_TASKS),
            rtf_window=max(1, settings.TTS_WORKER_RTF_WINDOW),
            min_tasks=max(0, settings.TTS_WORKER_MIN_TASKS_BEFORE_RECYCLE),
            age_jitter=AGE_JITTER,
            max_tasks=max(0, settings.TTS_WORKER_MAX_TASKS_PER_CHILD),
            task_jitter=TASK_JITTER,
        )


def weighted_median(samples: Iterable[tuple[float, float]]) -> float | None:
    """The value at the middle of the total weight of ``(value, weight)`` pairs."""
    ordered = sorted((v, w) for v, w in samples if w > 0)
    total = sum(w for _, w in ordered)
    if not ordered:
        return None
    # Equal weights give the plain median, the mean of the two middle values included.
    below = 0.0
    for i, (value, weight) in enumerate(ordered):
        below += weight
        if below > total / 2:
            return value
        if below == total / 2:
            return (value + ordered[i + 1][0]) / 2
    return ordered[-1][0]


Sample = tuple[float, float]  # (CPU seconds of synthesis per character, characters)


@dataclass
class RtfTracker:
    """Per engine: CPU seconds of synthesis per character, a baseline and a rolling window.

    Each figure is a median over characters, not over jobs: a job of 2,000
    characters weighs 2,000 times one of a single character, so a run of short
    jobs (whose fixed costs dominate) neither sets the baseline nor looks like drift.
    """

    baseline_tasks: int
    window: int
    baselines: dict[str, float] = field(default_factory=dict)
    _first: dict[str, list[Sample]] = field(default_factory=dict)
    _recent: dict[str, deque[Sample]] = field(default_factory=dict)

    def add(self, engine: str, seconds_per_char: float, characters: float = 1.0) -> None:
        if not seconds_per_char or seconds_per_char <= 0 or characters <= 0:
            return
        sample = (seconds_per_char, float(characters))
        if engine not in self.baselines:
            first = self._first.setdefault(engine, [])
            first.append(sample)
            if len(first) >= self.baseline_tasks:
                self.baselines[engine] = weighted_median(first) or 0.0
            return
        self._recent.setdefault(engine, deque(maxlen=self.window)).append(sample)

    def rolling(self, engine: str) -> float | None:
        return weighted_median(self._recent.get(engine) or self._first.get(engine) or [])

    def drifted(self, factor: float) -> str | None:
        """The engine whose full rolling window is ``factor`` x slower than its baseline."""
        if factor <= 0:
            return None
        for engine, base in self.baselines.items():
            recent = self._recent.get(engine)
            if recent is None or len(recent) < self.window or base <= 0:
                continue
            if (weighted_median(recent) or 0.0) > factor * base:
                return engine
        return None

    def summary(self) -> dict[str, dict[str, float | None]]:
        engines = set(self._first) | set(self._recent)
        return {
            e: {"baseline": _r(self.baselines.get(e)), "rolling": _r(self.rolling(e))}
            for e in sorted(engines)
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def jittered(limit: float, jitter: float, rng: random.Random | None = None) -> float:
    """``limit`` moved by up to +-``jitter`` of itself, drawn once per child."""
    if limit <= 0 or jitter <= 0:
        return max(0.0, limit)
    return limit * (1 + (rng or random.SystemRandom()).uniform(-jitter, jitter))


def lowered(limit: int, jitter: float, rng: random.Random | None = None) -> int:
    """A whole number drawn from [``limit`` x (1 - ``jitter``), ``limit``], once per child."""
    if limit <= 0 or jitter <= 0:
        return max(0, limit)
    low = max(1, math.ceil(limit * (1 - jitter)))
    return (rng or random.SystemRandom()).randint(low, limit)


@dataclass
class ChildHealth:
    """What one worker child knows about itself, and the decision to replace it."""

    policy: RecyclePolicy
    gpu_reader: GpuMemoryReader | None = None
    started_at: float = field(default_factory=time.time)
    rng: random.Random | None = None
    rtf: RtfTracker = field(init=False)
    max_age_seconds: float = field(init=False)
    max_tasks: int = field(init=False)  # this child's own task count limit
    recycle_reason: str | None = None
    held_back: str = ""
    last_rss_mb: float = 0.0
    last_gpu_mb: float | None = None
    baseline_rss_mb: float | None = None
    baseline_gpu_mb: float | None = None

    def __post_init__(self) -> None:
        self.rtf = RtfTracker(self.policy.rtf_baseline_tasks, self.policy.rtf_window)
        self.max_age_seconds = jittered(self.policy.max_age_seconds, self.policy.age_jitter, self.rng)
        self.max_tasks = lowered(self.policy.max_tasks, self.policy.task_jitter, self.rng)

    @property
    def age_deadline(self) -> float | None:
        """When this child's age limit is reached (epoch seconds), or None without one."""
        return self.started_at + self.max_age_seconds if self.max_age_seconds else None

    def read_gpu(self) -> float | None:
        if self.gpu_reader is None:
            return None
        try:
            value = self.gpu_reader()
        except Exception as exc:  # a reader must never break a task
            log.warning("GPU memory reader failed: %s", exc)
            return None
        return None if value is None else float(value)

    def set_baseline(self, rss_mb: float | None = None) -> None:
        """Remember the memory the child holds after its warm-up: limits count growth from here."""
        self.baseline_rss_mb = read_rss_mb() if rss_mb is None else rss_mb
        self.baseline_gpu_mb = self.read_gpu()
        for what, value, limit in (
            ("rss", self.baseline_rss_mb, self.policy.max_rss_mb),
            ("gpu_memory", self.baseline_gpu_mb, self.policy.max_gpu_mb),
        ):
            if limit and value is not None and value > limit:
                log.error(
                    "worker child %d starts at %s %.0f MiB, over its limit of %.0f MiB: it is replaced "
                    "only once it grows %.0f %% over that; raise the limit",
                    os.getpid(),
                    what,
                    value,
                    limit,
                    MEMORY_GROWTH * 100,
                )

    def _memory_reason(
        self, what: str, value: float | None, limit: float, baseline: float | None
    ) -> str | None:
        if not limit or value is None:
            return None
        if baseline is not None and value <= baseline * (1 + MEMORY_GROWTH):
            return None  # not grown since warm-up: a fresh child would be just as big
        if value <= limit:
            return None
        since = "" if baseline is None else f" (baseline {baseline:.0f} MiB after warm-up)"
        return f"{what} {value:.0f} MiB over {limit:.0f} MiB{since}"

    def _reason(self, now: float) -> str | None:
        p = self.policy
        reason = self._memory_reason("rss", self.last_rss_mb, p.max_rss_mb, self.baseline_rss_mb)
        reason = reason or self._memory_reason(
            "gpu_memory", self.last_gpu_mb, p.max_gpu_mb, self.baseline_gpu_mb
        )
        if reason:
            return reason
        if self.max_age_seconds and now - self.started_at > self.max_age_seconds:
            return f"age {now - self.started_at:.0f} s over {self.max_age_seconds:.0f} s"
        engine = self.rtf.drifted(p.rtf_drift_factor)
        if engine is None:
            return None
        return (
            f"rtf_drift {engine} rolling {self.rtf.rolling(engine):.6f} s/char over "
            f"{p.rtf_drift_factor:g} x baseline {self.rtf.baselines[engine]:.6f}"
        )

    def check(
        self, now: float | None = None, rss_mb: float | None = None, tasks_done: int | None = None
    ) -> str | None:
        """After a task: the reason to recycle now, or None. Remembers the readings.

        With ``tasks_done`` under the policy's ``min_tasks`` a reason is held
        back: logged once as an error, shown in ``held_back``, and the child serves on.
        """
        now = time.time() if now is None else now
        self.last_rss_mb = read_rss_mb() if rss_mb is None else rss_mb
        self.last_gpu_mb = self.read_gpu()
        if self.recycle_reason:
            return self.recycle_reason
        reason = self._reason(now)
        if reason and tasks_done is not None and tasks_done < self.policy.min_tasks:
            if reason_kind(reason) != reason_kind(self.held_back):
                log.error(
                    "worker child %d would be recycled after only %d tasks (%s); it keeps serving, "
                    "as replacing it would loop: check the limit",
                    os.getpid(),
                    tasks_done,
                    reason,
                )
            self.held_back = reason
            return None
        if reason:
            self.recycle_reason = reason
        return reason


def reason_kind(reason: str) -> str:
    """``"rss 1600 MiB over 1500 MiB"`` -> ``"rss"``: the counter a reason is filed under."""
    return reason.split(" ", 1)[0]


def take_turn(client: Any, node: str, worker_id: str, beats: list[dict[str, Any]]) -> bool:
    """Whether a child may leave now for a reason that can wait (:data:`CAN_WAIT`).

    Not while another child of its node is leaving or loading (its heartbeat
    says so), nor while another child holds the node's turn: two children
    that end tasks at the same moment both see the other ready, and only one
    of them sets the key. The turn passes on when a child of the node reports
    ready (:func:`end_turn`). A child waits at most :data:`TURN_TTL` seconds
    (``worker.after_task``), unless a sibling cannot load (:func:`sibling_cannot_load`).
    """
    for beat in beats:
        if (
            beat.get("node") == node
            and beat.get("worker_id") != worker_id
            and beat.get("state") in REPLACING_STATES
        ):
            return False
    return bool(client.set(TURN_KEY_PREFIX + node, worker_id, nx=True, ex=TURN_TTL))


def sibling_cannot_load(node: str, worker_id: str, beats: list[dict[str, Any]]) -> bool:
    """Whether another child of ``node`` is backing off or failed to load: this one is all that serves."""
    return any(
        beat.get("node") == node
        and beat.get("worker_id") != worker_id
        and beat.get("state") in CANNOT_LOAD_STATES
        for beat in beats
    )


def end_turn(client: Any, node: str) -> None:
    """A child of ``node`` is ready: the next child of the node may leave."""
    client.delete(TURN_KEY_PREFIX + node)


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
    """Make billiard's after-task memory probe report our decision. Returns False if it cannot.

    Billiard compares ``mem_rss()`` with ``worker_max_memory_per_child`` after
    every task. We answer "over any limit" once a recycle was requested and a
    token 1 KiB otherwise (never 0, which billiard logs as an unreadable
    figure): Celery's limit is applied by our check instead (it is folded into
    the ``rss`` limit, with the child's baseline and the minimum task count),
    so a child born over that limit does not restart after every task.
    Without it (a billiard that renamed ``mem_rss``) see :func:`health_for_child`.
    """
    # A private name of billiard: a release without it is logged once, with its version.
    if not private_apis.check(private_apis.BILLIARD_MEM_RSS):
        return False
    import billiard.pool as pool

    if getattr(pool.mem_rss, "_tts_hook", False):  # type: ignore[attr-defined]  # not in billiard-stubs
        return True

    def mem_rss() -> int:
        # Over any limit: billiard returns EX_RECYCLE and the parent forks a fresh child.
        return 2**62 if _exit_requested else 1

    mem_rss._tts_hook = True  # type: ignore[attr-defined]
    pool.mem_rss = mem_rss  # type: ignore[attr-defined]
    return True


def health_for_child(gpu_reader: GpuMemoryReader | None = None) -> ChildHealth:
    """Install the exit hook and give the child its health check (synthesis and analysis alike).

    Without the hook a child could decide to leave but never leave, and stay
    "recycling" in its heartbeat while it serves on: its check then has no
    limits, and Celery's own ``worker_max_tasks_per_child`` and
    ``worker_max_memory_per_child`` replace it, as in a stock Celery worker.
    """
    policy = RecyclePolicy.from_settings() if install_exit_hook() else RecyclePolicy()
    return ChildHealth(policy, gpu_reader=gpu_reader)


# ----------------------------------------------------------------------------- per-node records


def node_id() -> str:
    """The worker node a child belongs to: its Celery parent, unique per start (``owners.make_node_id``)."""
    return owners.make_node_id()


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
