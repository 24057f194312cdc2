"""The worker's exec probe (webapp/speech/runtime/probe.py): files its children rewrite at every beat,
read without Redis, PostgreSQL, Django's settings or torch."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from webapp.speech.runtime import probe

ROOT = Path(__file__).resolve().parents[2]


def _file(folder: Path, node: str, slot: int, state: str, age: float = 0.0) -> Path:
    path = folder / probe.file_name(node, slot)
    probe.touch(path, state)
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


def test_live_fails_on_one_stale_child_and_ready_needs_a_fresh_loaded_one(tmp_path: Path) -> None:
    assert probe.check("live", tmp_path, 60) == (True, "live: 0 child(ren) within 60 s")  # parent booting
    assert not probe.check("ready", tmp_path, 60)[0]
    _file(tmp_path, "synth@h", 0, "loading")
    assert probe.check("live", tmp_path, 60)[0] and not probe.check("ready", tmp_path, 60)[0]
    _file(tmp_path, "synth@h", 1, "ready")
    assert probe.check("ready", tmp_path, 60)[0]
    _file(tmp_path, "synth@h", 0, "ready", age=90)  # a child frozen for 90 s
    passed, why = probe.check("live", tmp_path, 60)
    assert not passed and "worker-synth@h-0.alive" in why
    _file(tmp_path, "synth@h", 1, "ready", age=90)
    assert not probe.check("ready", tmp_path, 60)[0]  # a stale "ready" is no readiness
    assert not list(tmp_path.glob(".*.tmp"))  # each write renamed into place


def test_a_node_filter_reads_only_that_workers_files(tmp_path: Path) -> None:
    _file(tmp_path, "piper@h", 0, "ready")
    _file(tmp_path, "piper@h-b", 0, "ready", age=600)  # another worker's, named with our prefix
    assert not probe.check("live", tmp_path, 60)[0]
    assert probe.check("live", tmp_path, 60, node="piper@h")[0]
    assert not probe.check("live", tmp_path, 60, node="piper@h-b")[0]
    assert probe.file_name("a b/c@h", 2) == "worker-a_b_c@h-2.alive"


def test_the_command_exits_0_or_1_without_redis_postgres_django_or_torch(tmp_path: Path) -> None:
    _file(tmp_path, "synth@h", 0, "ready")
    env = {**os.environ, "TTS_WORKER_PROBE_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "-X", "importtime", "-m", "webapp.speech.runtime.probe"]
    done = subprocess.run([*command, "ready"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ready: 1 of 1")
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    for heavy in ("torch", "redis", "psycopg", "django.db", "onnxruntime", "synth"):
        assert heavy not in imported, heavy
    assert "webapp.settings" not in imported
    stale = subprocess.run(
        [*command, "live", "--max-age", "0.001"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert stale.returncode == 1 and stale.stdout.startswith("not live")


def test_the_heartbeat_thread_touches_through_a_redis_outage_and_stops_when_it_hangs(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from webapp.speech.runtime import worker

    settings.TTS_WORKER_PROBE_DIR = tmp_path
    settings.TTS_HEARTBEAT_INTERVAL = 0.05
    state: Any = worker.WorkerState()
    assert state.probe_path.parent == tmp_path
    hang = threading.Event()
    resume = threading.Event()

    def publish(ttl: int | None = None) -> None:
        if hang.is_set():
            resume.wait(10)  # injected: the thread stuck, as in a frozen child
        raise RedisConnectionError("Connection refused")  # injected: Redis restarting

    monkeypatch.setattr(state, "publish", publish)
    monkeypatch.setattr(state, "watch_attempts", lambda: None)
    thread = threading.Thread(target=state.beat_forever, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert probe.check("live", tmp_path, 0.2)[0]  # Redis refuses every beat: still live
        assert state.probe_path.read_text().split()[0] == "starting"  # no model: not ready
        assert not probe.check("ready", tmp_path, 0.2)[0]
        hang.set()
        time.sleep(0.5)
        assert not probe.check("live", tmp_path, 0.2)[0]  # the thread stopped coming round
    finally:
        resume.set()
        state.stop()
        thread.join(5)
