"""What a synthesis worker child owns: the loaded model, its health and its heartbeat.

Models load in ``worker_process_init``, in each prefork child and never in the
parent, so CUDA is never initialised before fork. A child that cannot load its
model backs off with growing delays (the streak is kept per node in Redis, so
a replacement child continues the sequence instead of hammering) and says so
in its heartbeat. A warm-up synthesis runs before the child reports ready and
takes work. A thread publishes the heartbeat so it keeps beating during a long
job. After every task the child checks itself (``recycling.ChildHealth``) and
leaves cleanly when it should be replaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from billiard.process import current_process
from celery import current_app
from celery.signals import worker_init, worker_process_init, worker_process_shutdown, worker_shutting_down
from django.conf import settings
from django.db import connection, connections

from synth import Synthesizer, registry
from synth.engines import remote
from synth.hostjobs import HostJobs
from webapp import redis_clients
from webapp.speech import heartbeat, lifecycle, owners, voices
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.runtime import hooks, mode, probe, recycling, relay, rolling

log = logging.getLogger(__name__)


class WorkerState:
    def __init__(self) -> None:
        self.synthesizer: Any = None
        self.pid = os.getpid()
        self.worker_id = owners.make_worker_id(self.pid)
        self.node = recycling.node_id()
        self.state = "starting"
        self.loaded_at: float | None = None
        self.load_seconds: float | None = None
        self.started_at = time.time()
        self.tasks_done = 0
        self.voices: list[str] = []
        # The engines this child serves once loaded (TTS_WORKER_ENGINES less the unavailable ones),
        # what each can do (synth.registry.CAPABILITY_DEFAULTS) and why the others cannot serve.
        self.engines: list[str] = list(settings.TTS_WORKER_ENGINES)
        self.models: dict[str, dict[str, Any]] = {}
        self.unavailable: dict[str, str] = {}
        self.installed: list[str] = []  # every engine this host has (entry points), served or not
        self.device = settings.TTS_WORKER_DEVICE
        self.error = ""
        self.load_attempts = 0
        self.next_retry_at: float | None = None
        self.current_job: str | None = None
        self.current_lane: str | None = None  # the running job's (a one-job child's), for its threads
        self.waiting_since: float | None = None  # since when a recycle waits for the node's turn
        self.sibling_cannot_load = False  # seen while waiting: this child is all its node serves with
        # Jobs running on this host, by every worker of this var/ (synth.hostjobs).
        self.host_jobs = HostJobs(settings.TTS_VAR_LAYOUT.jobs_dir)
        self.health = recycling.ChildHealth(recycling.RecyclePolicy.from_settings(), gpu_reader=_gpu_reader())
        # The attempts running in this child (job id -> token): the watchdog's to check.
        self.attempts: dict[str, int] = {}
        self._ended_since: dict[tuple[str, int], float] = {}
        self._last_watch = 0.0
        self._bounded_connection: object = None  # the watchdog's connection its timeout was set on
        self._stop = threading.Event()
        # This child's probe file: its pool slot's, which a replacement child takes over.
        slot = getattr(current_process(), "index", None)  # set by billiard's pool on its children only
        self.probe_path = Path(settings.TTS_WORKER_PROBE_DIR) / probe.file_name(NODE_NAME, int(slot or 0))
        self._probe_failed = False

    @property
    def ready(self) -> bool:
        return self.synthesizer is not None and self.state in ("ready", "recycling")

    def snapshot(self) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        with contextlib.suppress(Exception):  # Redis hiccup: the beat itself will say so
            stats = recycling.node_stats(redis_clients.heartbeats(), self.node)
        rss = round(psutil.Process().memory_info().rss / 2**20, 1)
        gpu = self.health.read_gpu()
        return {
            "worker_id": self.worker_id,
            "node": self.node,
            "host": socket.gethostname(),
            "pid": self.pid,
            "state": self.state,
            "device": self.device,
            "engines": self.engines,
            # Jobs of each engine this child runs at once: what the lanes' reservation counts.
            "job_slots": {engine: mode.jobs_at_once(engine, self.models) for engine in self.engines},
            "models": self.models,
            # Each remote model's replicas as this child uses them (the operations page adds them up).
            "upstreams": remote.upstream_figures(),
            "unavailable": self.unavailable,
            "installed": self.installed,
            "voices": self.voices,
            "started_at": self.started_at,
            "loaded_at": self.loaded_at,
            "tasks_done": self.tasks_done,
            "max_tasks_per_child": self.health.max_tasks,  # this child's own (drawn) limit
            "current_job": self.current_job,
            "rss_mb": rss,
            "gpu_mb": _round(gpu),
            "rtf": self.health.rtf.summary(),
            "baseline_rss_mb": _round(self.health.baseline_rss_mb),
            "baseline_gpu_mb": _round(self.health.baseline_gpu_mb),
            "recycle_at": self.health.age_deadline,
            "recycle_reason": recycling.exit_requested() or "",
            "recycle_held_back": self.health.held_back,
            # What the operations page measures the "closest recycle reason" against.
            "limits": {
                "max_rss_mb": self.health.policy.max_rss_mb,
                "max_gpu_mb": self.health.policy.max_gpu_mb,
            },
            "load_seconds": _round(self.load_seconds),
            **stats,
            "load_attempts": self.load_attempts,
            "next_retry_at": self.next_retry_at,
            "error": self.error,
            "at": time.time(),
        }

    def publish(self, ttl: int | None = None) -> None:
        heartbeat.publish(self.worker_id, self.snapshot(), ttl=ttl)

    @contextlib.contextmanager
    def watching(self, job_id: str, token: int) -> Iterator[None]:
        """While attempt ``token`` of ``job_id`` runs in this child, the watchdog checks its job."""
        self.attempts[job_id] = token
        try:
            yield
        finally:
            self.attempts.pop(job_id, None)

    def touch_probe(self) -> None:
        """Say in this child's probe file that its heartbeat thread came round, and whether it serves."""
        if self._stop.is_set():
            return  # leaving: the shutdown removes the file, and a late beat must not bring it back
        try:
            probe.touch(self.probe_path, probe.READY if self.ready else self.state)
            self._probe_failed = False
        except OSError as exc:
            if not self._probe_failed:  # once per streak, not every beat
                log.warning("probe file %s not written: %s", self.probe_path, exc)
            self._probe_failed = True

    def beat_forever(self) -> None:
        """The heartbeat thread: the probe file, then the heartbeat in Redis. It never asks the
        database, so a PostgreSQL stall (a lock, a failover) never stops the probe file and no
        busy pod is restarted for it; the watchdog asks from a thread of its own."""
        while not self._stop.is_set():
            # First, and without Redis or the database: the exec probe sees this thread come
            # round however those are (probe.py says what a stale file catches).
            self.touch_probe()
            try:
                self.publish()
                if self.state == "ready" and (plan := rolling.turn(self.worker_id)) is not None:
                    rolling.leave(self, rolling.reason(plan))
            except Exception as exc:  # Redis down: keep trying, never kill the child
                log.warning("heartbeat failed: %s", exc)
            self._stop.wait(settings.TTS_HEARTBEAT_INTERVAL)

    def watch_forever(self) -> None:
        """The watchdog thread: its database reads, on a connection of its own (Django's are per
        thread), wait for nothing but themselves; each gives up after TTS_WATCHDOG_QUERY_TIMEOUT."""
        while not self._stop.is_set():
            try:
                self.watch_attempts()
            except Exception as exc:  # the database away or stalled: no verdict, the reaper is the backstop
                log.warning("watchdog check failed: %s", exc)
                connections.close_all()  # this thread's own: a broken one is not reused
            self._stop.wait(settings.TTS_HEARTBEAT_INTERVAL)

    def watch_attempts(self, now: float | None = None) -> None:
        """End this child when a job ended (reaped, failed, taken over) while its attempt still runs here.

        The attempt notices an ended job at its next fenced write and its hard
        limit by an alarm; neither reaches a task stuck in native code (which
        ignores SIGALRM) or a batching thread (which gets no signal). Such a
        child would keep its message and say "ready" in its heartbeat until
        Celery's own limit, far above every job's. The attempt gets
        ``TTS_JOB_HARD_GRACE_SECONDS`` to stop by itself; then the child leaves:
        its heartbeat goes, the parent forks a fresh child, and the message comes
        back to find its job ended.
        """
        now = time.monotonic() if now is None else now
        running = dict(self.attempts)
        if not running:
            self._ended_since.clear()
            return
        if now - self._last_watch < WATCHDOG_INTERVAL:
            return
        self._last_watch = now
        self._bound_watchdog_reads()
        owned = set(
            SynthesisJob.objects.filter(
                id__in=list(running), status=SynthesisJob.Status.RUNNING, worker=self.worker_id
            ).values_list("id", "claim_token")
        )
        owned_keys = {(str(job_id), int(token)) for job_id, token in owned}
        ended = {key for key in running.items() if key not in owned_keys}
        self._ended_since = {key: self._ended_since.get(key, now) for key in ended}
        stuck = [
            key
            for key, since in self._ended_since.items()
            if now - since > settings.TTS_JOB_HARD_GRACE_SECONDS
        ]
        if stuck:
            self._end_stuck(stuck)

    def _bound_watchdog_reads(self) -> None:
        """Give this thread's connection a statement_timeout, once per connection (its session's,
        so the watchdog's read stays the last statement: tests tell its connection apart by it).

        A lock on the jobs' table (a migration, a stuck transaction) or a stalled server then ends
        a read with an error instead of holding the watchdog for as long; connecting is bounded by
        DATABASE_CONNECT_TIMEOUT. Only this thread's connection: a task's writes keep no limit.
        """
        connection.ensure_connection()
        if connection.connection is not self._bounded_connection:
            with connection.cursor() as cursor:
                timeout_ms = str(round(settings.TTS_WATCHDOG_QUERY_TIMEOUT * 1000))
                cursor.execute("SELECT set_config('statement_timeout', %s, false)", [timeout_ms])
            self._bounded_connection = connection.connection

    def _end_stuck(self, stuck: list[tuple[str, int]]) -> None:
        jobs = ", ".join(f"{job_id} (token {token})" for job_id, token in stuck)
        log.error(
            "worker child %d: job %s ended %d s ago while its task still runs (stuck where no "
            "signal reaches it); the child leaves and a fresh one replaces it",
            self.pid,
            jobs,
            settings.TTS_JOB_HARD_GRACE_SECONDS,
        )
        with contextlib.suppress(Exception):
            client = redis_clients.heartbeats()
            recycling.record_event(
                client,
                self.node,
                {
                    "event": "exit",
                    "pid": self.pid,
                    "at": time.time(),
                    "tasks": self.tasks_done,
                    "reason": f"stuck {jobs}",
                },
            )
            heartbeat.remove(self.worker_id)
        os._exit(STUCK_EXIT_CODE)

    def stop(self) -> None:
        self._stop.set()


# How often the watchdog reads the rows of the attempts running in this child (one query).
WATCHDOG_INTERVAL = 2.0
# The exit status of a child the watchdog ended (EX_SOFTWARE): the parent logs it.
STUCK_EXIT_CODE = 70


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


STATE: WorkerState | None = None
# The Celery worker's node name (-n), noted in the parent at worker_init; children inherit it.
NODE_NAME = "worker"


def current() -> WorkerState:
    global STATE
    if STATE is None or STATE.pid != os.getpid():
        STATE = WorkerState()
    return STATE


def _gpu_reader() -> recycling.GpuMemoryReader | None:
    try:
        return recycling.load_gpu_reader()
    except Exception as exc:
        log.error("cannot load GPU memory reader %r: %s", settings.TTS_WORKER_GPU_MEMORY_READER, exc)
        return None


# ----------------------------------------------------------------------------- loading


def load_models(state: WorkerState) -> None:
    hooks.install()
    # Before any model: a worker from older code must not claim against a newer schema
    # (it backs off and says why in its heartbeat, like a model that fails to load).
    lifecycle.check_claim_protocol()

    load_started = time.monotonic()
    synthesizer = Synthesizer(
        device=settings.TTS_WORKER_DEVICE,
        voices_dir=settings.TTS_VOICES_DIR,
        engines=settings.TTS_WORKER_ENGINES,
        threads=settings.TTS_WORKER_THREADS,
        piper_runtime=settings.TTS_WORKER_PIPER_RUNTIME,
        batch_jobs=settings.TTS_WORKER_BATCH_JOBS,
        batch_wait_ms=settings.TTS_WORKER_BATCH_WAIT_MS,
        solo_threads=settings.TTS_WORKER_SOLO_THREADS or None,
        busy=lambda: state.host_jobs.others() > 0 or yields_to_interactive(state),
        # Piper's voices patched to report their durations (word timestamps), kept for the next child.
        model_cache_dir=str(settings.TTS_VAR_LAYOUT.cache_dir),
        # An engine that is not installed or cannot load is reported unavailable (the submits for it
        # answer 503 engine_unavailable); the others serve. Only none loading is a failed load.
        tolerant=True,
        models_dir=settings.TTS_MODELS_DIR,
    )
    # A model that needs more than Celery's hard memory limit per child would be killed on every load.
    synthesizer.memory_limit_mb = settings.CELERY_WORKER_MAX_MEMORY_PER_CHILD / 1024 or None
    try:
        synthesizer.load()
    finally:
        state.unavailable = dict(synthesizer.unavailable)
    for name, reason in synthesizer.unavailable.items():
        log.error("engine %s is unavailable on this worker: %s", name, reason)
    hooks.after_load(synthesizer)
    state.state = "warming_up"
    synthesizer.warm_up()
    found = synthesizer.voices()
    _sync_builtin_voices(state, found)
    devices = {getattr(e, "device", "cpu") for e in getattr(synthesizer, "_engines", {}).values()}
    devices.discard("cpu")
    state.device = sorted(devices)[0] if devices else "cpu"
    state.synthesizer = synthesizer
    state.engines = synthesizer.served_engines()
    state.installed = list(registry.installed())
    state.models = {
        name: {**synthesizer.capabilities(name), **synthesizer.model_info.get(name, {})}
        for name in state.engines
    }
    state.voices = [v.id for v in found]
    state.loaded_at = time.time()
    state.load_seconds = time.monotonic() - load_started
    state.health.started_at = state.loaded_at
    # Warmed up: what it holds now is what any fresh child holds, the baseline limits count from.
    state.health.set_baseline()


def yields_to_interactive(state: WorkerState) -> bool:
    """Whether this child's batch job keeps to its share of the cores though it runs alone.

    A job alone on the host uses every core (``TTS_WORKER_SOLO_THREADS``), decided before each of
    its sentences. A batch job's sentence then held both cores of a 2-core host when an agent's
    unit arrived, and the unit's first audio waited on them. While interactive work ran on this
    host in the last ``TTS_WORKER_INTERACTIVE_QUIET_SECONDS`` (and the lanes reserve capacity for
    it), a batch job keeps to its share; a backlog alone still has every core.
    """
    return (
        state.current_lane == SynthesisJob.Lane.BATCH
        and settings.TTS_WORKER_INTERACTIVE_RESERVED > 0
        and state.host_jobs.interactive_within(settings.TTS_WORKER_INTERACTIVE_QUIET_SECONDS)
    )


def _sync_builtin_voices(state: WorkerState, found: list[Any]) -> None:
    """Upsert the voices this child serves into the database.

    Upserting 100+ eSpeak voices on every recycle costs a second: the first child of a
    node writes them all (new capabilities after an upgrade), later ones only what is missing.
    """

    synced_key = recycling.NODE_KEY_PREFIX + state.node
    first_of_node = True
    with contextlib.suppress(Exception):
        first_of_node = not redis_clients.heartbeats().hget(synced_key, "voices_synced")
    known = set(
        Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY).values_list(
            "voice_id", flat=True
        )
    )
    missing = found if first_of_node else [v for v in found if v.id not in known]
    if missing:
        voices.sync_builtin_voices(missing)
    if first_of_node:
        _retire_engines_gone()
    with contextlib.suppress(Exception):
        redis_clients.heartbeats().hset(synced_key, "voices_synced", 1)
        redis_clients.heartbeats().expire(synced_key, recycling.NODE_KEY_TTL)


def _retire_engines_gone() -> None:
    """Built-in voices of an engine this host no longer has, and no live worker announces, go.

    An engine is a package installed beside the service (synth.registry): removed, its voices
    must leave /api/v1/voices and /v1/models. Another host that still has it restores them
    when its next child loads (its first child of a node upserts every voice).
    """
    with contextlib.suppress(Exception):  # Redis away: the next node start retires them
        announced = {
            str(e)
            for beat in heartbeat.live_workers()
            for e in [*(beat.get("engines") or []), *(beat.get("installed") or [])]
        }
        gone = voices.retire_engines(set(registry.installed()) | announced)
        if gone:
            log.warning("voices of engines no longer installed retired: %s", ", ".join(sorted(gone)))


def load_with_backoff(state: WorkerState) -> bool:
    """Try to load until it works; wait longer after each failure. False: give this child up.

    Celery kills a child that has not come up within ``worker_proc_alive_timeout``;
    the child gives up itself before that (a new one is forked at once and
    continues the node's failure streak from Redis, so the delays keep growing).
    """
    client = redis_clients.heartbeats()
    base, cap = settings.TTS_WORKER_LOAD_BACKOFF_BASE, settings.TTS_WORKER_LOAD_BACKOFF_MAX
    alive_timeout = float(current_app.conf.worker_proc_alive_timeout or 120)
    deadline = time.time() + alive_timeout - 5.0
    # A single wait must end before Celery's patience does, or it kills us mid-sleep.
    cap = min(cap, max(1.0, alive_timeout - 10.0))
    while True:
        failures = 0
        with contextlib.suppress(Exception):
            failures = recycling.load_failure_streak(client, state.node, None)
        delay = recycling.backoff_delay(failures, base, cap)
        if delay:
            if time.time() + delay > deadline and state.load_attempts > 0:
                return False
            state.state = "backoff"
            state.next_retry_at = time.time() + delay
            log.warning("model load failed %d times on this node; next try in %.1f s", failures, delay)
            _publish_quietly(state)
            time.sleep(delay)
        state.state = "loading"
        state.next_retry_at = None
        state.load_attempts += 1
        _publish_quietly(state)
        try:
            load_models(state)
        except Exception as exc:
            state.state = "load_failed"
            state.error = f"{type(exc).__name__}: {exc}"[:500]
            log.exception("model load failed")
            with contextlib.suppress(Exception):
                recycling.load_failure_streak(client, state.node, +1)
            _publish_quietly(state)
            continue
        state.error = ""
        with contextlib.suppress(Exception):
            recycling.load_failure_streak(client, state.node, 0)
        return True


def _publish_quietly(state: WorkerState) -> None:
    try:
        state.publish()
    except Exception as exc:
        log.warning("heartbeat failed: %s", exc)


def _forget_recycled_siblings(state: WorkerState) -> None:
    """Drop the "recycling" heartbeats this node's departed children left behind."""
    for beat in heartbeat.live_workers():
        if beat.get("node") == state.node and beat.get("state") == "recycling":
            if owners.owner_is_dead(str(beat.get("worker_id", ""))):
                heartbeat.remove(str(beat.get("worker_id")))


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """In the Celery parent, before its children fork: note its node name, and drop the probe files
    its earlier run left (a folder that outlives the process, as a pod's emptyDir does)."""
    global NODE_NAME
    if settings.TTS_WORKER_ROLE != "synth":
        return
    NODE_NAME = str(getattr(sender, "hostname", None) or NODE_NAME)
    with contextlib.suppress(OSError):
        for path in probe.files(Path(settings.TTS_WORKER_PROBE_DIR), NODE_NAME):
            probe.remove(path)


@worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    if settings.TTS_WORKER_ROLE != "synth":
        # The housekeeping worker serves no voice: no model, no heartbeat.
        return
    state = current()
    # Without billiard's mem_rss to hook (logged), a check with no limits: Celery's own replace the child.
    state.health = recycling.health_for_child(state.health.gpu_reader)
    signal.signal(HAND_BACK_SIGNAL, _on_hand_back_signal)
    rolling.install_leave_handler(current)
    with contextlib.suppress(OSError):
        state.probe_path.parent.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=state.beat_forever, name="heartbeat", daemon=True).start()
    threading.Thread(target=state.watch_forever, name="watchdog", daemon=True).start()
    if not load_with_backoff(state):
        log.error(
            "worker child %s gives up loading for now; a new child continues the backoff", state.worker_id
        )
        _publish_quietly(state)
        # Celery swallows exceptions from signal handlers: leave explicitly, before taking work.
        os._exit(3)
    relay.start(state.engines, state.models)  # the voices a remote model keeps on its replicas
    state.state = "ready"
    state.touch_probe()  # ready now, not at the next beat
    _publish_quietly(state)
    with contextlib.suppress(Exception):
        recycling.record_event(
            redis_clients.heartbeats(), state.node, {"event": "ready", "pid": state.pid, "at": time.time()}
        )
        _forget_recycled_siblings(state)
        recycling.end_turn(redis_clients.heartbeats(), state.node)
    log.info("worker child %s ready on %s with %d voices", state.worker_id, state.device, len(state.voices))


@worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    state = STATE
    if state is None or state.pid != os.getpid():
        return
    state.stop()
    # A child that leaves takes its file along: its replacement writes its own, and on a
    # worker's stop no file of a departed child goes stale while the others finish their jobs.
    with contextlib.suppress(OSError):
        probe.remove(state.probe_path)
    reason = recycling.exit_requested()
    try:
        client = redis_clients.heartbeats()
        recycling.record_event(
            client,
            state.node,
            {
                "event": "exit",
                "pid": state.pid,
                "at": time.time(),
                "tasks": state.tasks_done,
                "reason": reason or "",
            },
        )
        if reason and state.synthesizer is not None:
            # Stay listed (not "ready") while the replacement loads, so the
            # node does not look dead to submit's no_worker check for a second.
            state.state = "recycling"
            state.publish(ttl=max(settings.TTS_HEARTBEAT_TTL, 30))
        else:
            heartbeat.remove(state.worker_id)
    except Exception:  # Redis may be gone already at shutdown
        log.debug("heartbeat removal failed", exc_info=True)


# ----------------------------------------------------------------------------- after each task


def after_task(
    state: WorkerState,
    engine: str | None,
    cpu_seconds: float | None,
    characters: int,
    oom: bool = False,
    ran: bool = True,
) -> str | None:
    """Count the task, feed the health check, and ask to leave when the child should be replaced.

    ``cpu_seconds`` and ``characters`` (of a succeeded synthesis; None/0
    otherwise) feed the drift check, which compares CPU seconds per character:
    a busy host slows a child without degrading it. ``ran``: the message claimed a job. One that
    claimed nothing (a wake-up spent while the batch share was full, or for a job taken already)
    is not a task toward the child's limit: a backlog's spent wake-ups recycled the child kept free
    for interactive work every two hundred of them, and a unit arriving during its reload waited.
    """
    if ran:
        state.tasks_done += 1
    state.current_job = None
    state.current_lane = None
    if engine and cpu_seconds and characters > 0:
        state.health.rtf.add(engine, cpu_seconds / characters, characters)
    if oom:
        # Not held back by the minimum task count: after an out-of-memory error
        # the runtime's state is suspect, and the job's retry wants a fresh child.
        state.health.recycle_reason = "oom out-of-memory during a job"
    reason = state.health.check(tasks_done=state.tasks_done)
    max_tasks = state.health.max_tasks
    if not reason and max_tasks and state.tasks_done >= max_tasks:
        # The child's own limit (drawn per child; billiard's, ten times the setting, is a backstop).
        reason = f"max_tasks {state.tasks_done} tasks"
    if reason and recycling.reason_kind(reason) in recycling.CAN_WAIT and not _my_turn_to_leave(state):
        if state.waiting_since is None:
            log.info("worker child %d waits for its node's turn to be replaced (%s)", state.pid, reason)
            state.waiting_since = time.monotonic()
        if time.monotonic() - state.waiting_since < recycling.TURN_TTL:
            return None
        if state.sibling_cannot_load:
            # Leaving now would leave the node empty (its replacement would fail to load too):
            # a reason that can wait waits, up to billiard's backstop.
            return None
        log.warning(
            "worker child %d waited %d s for its node's turn to be replaced; it leaves now (%s)",
            state.pid,
            recycling.TURN_TTL,
            reason,
        )
    if reason:
        rolling.start_recycle(state, reason)
    return reason


def _my_turn_to_leave(state: WorkerState) -> bool:
    """Children of a node that share its jobs reach their limits together: they leave in turns."""
    try:
        client = redis_clients.heartbeats()
        beats = heartbeat.live_workers()
        state.sibling_cannot_load = recycling.sibling_cannot_load(state.node, state.worker_id, beats)
        return recycling.take_turn(client, state.node, state.worker_id, beats)
    except Exception as exc:  # Redis away: leave, as a child always did
        log.warning("could not take the node's recycle turn: %s", exc)
        return True


# ----------------------------------------------------------------------------- warm shutdown

# Sent by the worker parent to its children when the stop grace has run out.
HAND_BACK_SIGNAL = signal.SIGUSR2
_hand_back = threading.Event()
_grace_timer_started = threading.Event()


def handing_back() -> bool:
    """True once the worker's stop grace ran out: the running job goes back to the queue.

    The task's cancel check reads this between sentences; the job is then
    re-queued without counting the attempt (it did nothing wrong), its
    partial output is removed and the child ends its task normally.
    """
    return _hand_back.is_set()


def _on_hand_back_signal(signum: int, frame: Any) -> None:
    _hand_back.set()


@worker_shutting_down.connect
def _on_shutting_down(how: str = "", **_: Any) -> None:
    """Warm shutdown of the Celery parent (SIGTERM, Ctrl-C, ``make stop``, systemd stop).

    Celery stops taking messages and waits for the running tasks. They get
    ``TTS_WORKER_STOP_GRACE`` seconds; then each child is told to hand its job
    back, which it does before its next sentence, so the worker exits well
    before the supervisor's (or systemd's) kill, which comes later still.
    """
    if settings.TTS_WORKER_ROLE != "synth" or how != "Warm" or _grace_timer_started.is_set():
        return
    _grace_timer_started.set()
    grace = float(settings.TTS_WORKER_STOP_GRACE)
    threading.Thread(target=_hand_back_after, args=(grace,), name="stop-grace", daemon=True).start()


def _hand_back_after(grace: float) -> None:
    time.sleep(grace)
    pids = [child.pid for child in psutil.Process().children()]
    log.warning("stop grace of %g s over: %d worker children hand their jobs back", grace, len(pids))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, HAND_BACK_SIGNAL)
