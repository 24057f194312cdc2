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
import socket
import threading
import time
from typing import Any

import psutil
from celery import current_app
from celery.signals import worker_process_init, worker_process_shutdown
from django.conf import settings

from webapp.speech import heartbeat, recycling

log = logging.getLogger(__name__)


def make_worker_id(pid: int | None = None) -> str:
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


class WorkerState:
    def __init__(self) -> None:
        self.synthesizer: Any = None
        self.pid = os.getpid()
        self.worker_id = make_worker_id(self.pid)
        self.node = recycling.node_id()
        self.state = "starting"
        self.loaded_at: float | None = None
        self.started_at = time.time()
        self.tasks_done = 0
        self.voices: list[str] = []
        self.device = settings.TTS_WORKER_DEVICE
        self.error = ""
        self.load_attempts = 0
        self.next_retry_at: float | None = None
        self.current_job: str | None = None
        self.health = recycling.ChildHealth(recycling.RecyclePolicy.from_settings(), gpu_reader=_gpu_reader())
        self._stop = threading.Event()

    @property
    def ready(self) -> bool:
        return self.synthesizer is not None and self.state in ("ready", "recycling")

    def snapshot(self) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        with contextlib.suppress(Exception):  # Redis hiccup: the beat itself will say so
            stats = recycling.node_stats(heartbeat.client(), self.node)
        rss = round(psutil.Process().memory_info().rss / 2**20, 1)
        gpu = self.health.read_gpu()
        return {
            "worker_id": self.worker_id,
            "node": self.node,
            "host": socket.gethostname(),
            "pid": self.pid,
            "state": self.state,
            "device": self.device,
            "engines": settings.TTS_WORKER_ENGINES,
            "voices": self.voices,
            "started_at": self.started_at,
            "loaded_at": self.loaded_at,
            "tasks_done": self.tasks_done,
            "max_tasks_per_child": current_app.conf.worker_max_tasks_per_child,
            "current_job": self.current_job,
            "rss_mb": rss,
            "gpu_mb": None if gpu is None else round(gpu, 1),
            "rtf": self.health.rtf.summary(),
            "recycle_reason": recycling.exit_requested() or "",
            **stats,
            "load_attempts": self.load_attempts,
            "next_retry_at": self.next_retry_at,
            "error": self.error,
            "at": time.time(),
        }

    def publish(self, ttl: int | None = None) -> None:
        heartbeat.publish(self.worker_id, self.snapshot(), ttl=ttl)

    def beat_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish()
            except Exception as exc:  # Redis down: keep trying, never kill the child
                log.warning("heartbeat failed: %s", exc)
            self._stop.wait(settings.TTS_HEARTBEAT_INTERVAL)

    def stop(self) -> None:
        self._stop.set()


STATE: WorkerState | None = None


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


# ----------------------------------------------------------------------------- liveness of other workers


def owner_is_dead(owner: str, me: str | None = None) -> bool:
    """Whether the worker child named ``owner`` (``host:pid``) is gone.

    Same host: the pid tells at once (a zombie counts as dead), so a killed
    child's job is picked up within seconds. Other hosts: its heartbeat key has
    expired. When in doubt (Redis unreachable), alive: the lease reaper is the
    backstop.
    """
    if not owner:
        return False
    if me is not None and owner == me:
        return True  # we are running this very message, so that earlier run of "us" is gone
    host, _, pid_text = owner.rpartition(":")
    if host == socket.gethostname() and pid_text.isdigit():
        try:
            proc = psutil.Process(int(pid_text))
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        return False
    try:
        return not bool(heartbeat.client().exists(heartbeat.KEY_PREFIX + owner))
    except Exception:
        return False


# ----------------------------------------------------------------------------- loading


def load_models(state: WorkerState) -> None:
    from synth import Synthesizer
    from webapp.speech import services
    from webapp.speech.models import Voice

    synthesizer = Synthesizer(
        device=settings.TTS_WORKER_DEVICE,
        voices_dir=settings.TTS_VOICES_DIR,
        engines=settings.TTS_WORKER_ENGINES,
        threads=settings.TTS_WORKER_THREADS,
    )
    synthesizer.load()
    state.state = "warming_up"
    synthesizer.warm_up()
    voices = synthesizer.voices()
    # Upserting 100+ eSpeak voices on every recycle costs a second: the first child of a
    # node writes them all (new capabilities after an upgrade), later ones only what is missing.
    synced_key = recycling.NODE_KEY_PREFIX + state.node
    first_of_node = True
    with contextlib.suppress(Exception):
        first_of_node = not heartbeat.client().hget(synced_key, "voices_synced")
    known = set(
        Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY).values_list(
            "voice_id", flat=True
        )
    )
    missing = voices if first_of_node else [v for v in voices if v.id not in known]
    if missing:
        services.sync_builtin_voices(missing)
    with contextlib.suppress(Exception):
        heartbeat.client().hset(synced_key, "voices_synced", 1)
        heartbeat.client().expire(synced_key, recycling.NODE_KEY_TTL)
    devices = {getattr(e, "device", "cpu") for e in getattr(synthesizer, "_engines", {}).values()}
    devices.discard("cpu")
    state.device = sorted(devices)[0] if devices else "cpu"
    state.synthesizer = synthesizer
    state.voices = [v.id for v in voices]
    state.loaded_at = time.time()
    state.health.started_at = state.loaded_at


def load_with_backoff(state: WorkerState) -> bool:
    """Try to load until it works; wait longer after each failure. False: give this child up.

    Celery kills a child that has not come up within ``worker_proc_alive_timeout``;
    the child gives up itself before that (a new one is forked at once and
    continues the node's failure streak from Redis, so the delays keep growing).
    """
    client = heartbeat.client()
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
            if owner_is_dead(str(beat.get("worker_id", ""))):
                heartbeat.remove(str(beat.get("worker_id")))


@worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    if settings.TTS_WORKER_ROLE != "synth":
        # The housekeeping worker serves no voice: no model, no heartbeat.
        return
    state = current()
    recycling.install_exit_hook()
    threading.Thread(target=state.beat_forever, name="heartbeat", daemon=True).start()
    if not load_with_backoff(state):
        log.error(
            "worker child %s gives up loading for now; a new child continues the backoff", state.worker_id
        )
        _publish_quietly(state)
        # Celery swallows exceptions from signal handlers: leave explicitly, before taking work.
        os._exit(3)
    state.state = "ready"
    _publish_quietly(state)
    with contextlib.suppress(Exception):
        recycling.record_event(
            heartbeat.client(), state.node, {"event": "ready", "pid": state.pid, "at": time.time()}
        )
        _forget_recycled_siblings(state)
    log.info("worker child %s ready on %s with %d voices", state.worker_id, state.device, len(state.voices))


@worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    state = STATE
    if state is None or state.pid != os.getpid():
        return
    state.stop()
    reason = recycling.exit_requested()
    try:
        client = heartbeat.client()
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


def after_task(state: WorkerState, engine: str | None, rtf: float | None, oom: bool = False) -> str | None:
    """Count the task, feed the health check, and ask to leave when the child should be replaced."""
    state.tasks_done += 1
    state.current_job = None
    if engine and rtf:
        state.health.rtf.add(engine, rtf)
    reason: str | None = "oom out-of-memory during a job" if oom else None
    if reason:
        state.health.recycle_reason = reason
    reason = state.health.check() or reason
    conf = current_app.conf
    max_tasks = conf.worker_max_tasks_per_child
    max_kb = conf.worker_max_memory_per_child
    if not reason and max_kb and state.health.last_rss_mb * 1024 > max_kb:
        reason = f"rss {state.health.last_rss_mb:.0f} MiB over worker_max_memory_per_child"
    if not reason and max_tasks and state.tasks_done >= max_tasks:
        # billiard ends the child itself; counted here so the heartbeat shows it.
        reason = f"max_tasks {state.tasks_done} tasks"
    if reason and not recycling.exit_requested():
        recycling.request_exit(reason)
        state.state = "recycling"
        try:
            recycling.record_recycle(heartbeat.client(), state.node, reason, state.pid, state.tasks_done)
        except Exception as exc:
            log.warning("could not record recycle: %s", exc)
    return reason
