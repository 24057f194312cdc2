"""What a synthesis worker child owns: the loaded model and its heartbeat.

Models load in ``worker_process_init`` (each prefork child, never the parent,
so CUDA is never touched before fork); a thread publishes the heartbeat so it
keeps beating during a long job.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import psutil
from celery.signals import worker_process_init, worker_process_shutdown
from django.conf import settings

from webapp.speech import heartbeat

log = logging.getLogger(__name__)


class WorkerState:
    def __init__(self) -> None:
        self.synthesizer: Any = None
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.state = "starting"
        self.loaded_at: float | None = None
        self.started_at = time.time()
        self.tasks_done = 0
        self.voices: list[str] = []
        self.error = ""
        self._stop = threading.Event()

    def snapshot(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": self.state,
            "device": settings.TTS_WORKER_DEVICE,
            "engines": settings.TTS_WORKER_ENGINES,
            "voices": self.voices,
            "loaded_at": self.loaded_at,
            "tasks_done": self.tasks_done,
            "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
            "error": self.error,
            "at": time.time(),
        }

    def beat_forever(self) -> None:
        while not self._stop.is_set():
            try:
                heartbeat.publish(self.worker_id, self.snapshot())
            except Exception as exc:  # Redis down: keep trying, never kill the child
                log.warning("heartbeat failed: %s", exc)
            self._stop.wait(settings.TTS_HEARTBEAT_INTERVAL)

    def stop(self) -> None:
        self._stop.set()


STATE: WorkerState | None = None


def current() -> WorkerState:
    global STATE
    if STATE is None or STATE.worker_id != f"{socket.gethostname()}:{os.getpid()}":
        STATE = WorkerState()
    return STATE


def load_models(state: WorkerState) -> None:
    from synth import Synthesizer

    from webapp.speech import services

    synthesizer = Synthesizer(
        device=settings.TTS_WORKER_DEVICE,
        voices_dir=settings.TTS_VOICES_DIR,
        engines=settings.TTS_WORKER_ENGINES,
        threads=settings.TTS_WORKER_THREADS,
    )
    synthesizer.load()
    synthesizer.warm_up()
    voices = synthesizer.voices()
    services.sync_builtin_voices(
        {
            "id": v.id,
            "name": v.name,
            "engine": v.engine,
            "language": v.language,
            "sample_rate": v.sample_rate,
            "capabilities": v.capabilities,
        }
        for v in voices
    )
    state.synthesizer = synthesizer
    state.voices = [v.id for v in voices]
    state.loaded_at = time.time()
    state.state = "ready"


@worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    state = current()
    threading.Thread(target=state.beat_forever, name="heartbeat", daemon=True).start()
    try:
        load_models(state)
    except Exception as exc:
        state.state = "load_failed"
        state.error = str(exc)[:500]
        log.exception("model load failed")
        raise
    log.info("worker child %s ready with %d voices", state.worker_id, len(state.voices))


@worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    if STATE is not None:
        STATE.stop()
        try:
            heartbeat.remove(STATE.worker_id)
        except Exception:  # Redis may be gone already at shutdown
            log.debug("heartbeat removal failed", exc_info=True)
