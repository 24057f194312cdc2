"""A real worker's probe files: ready once its model is loaded, live through a Redis restart, not
live while its child is frozen (webapp/speech/runtime/probe.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.stack import CFG

ROOT = Path(__file__).resolve().parents[3]


def _probe(what: str, node: str, max_age: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "webapp.speech.runtime.probe", what, "--max-age", str(max_age)]
    return subprocess.run(
        [*command, "--node", node],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ.copy(),
    )


def _child_file(worker: Any, timeout: float = 30) -> tuple[int, Path]:
    """(pid, file) of the worker's child, once its file says ready."""
    folder = Path(settings.TTS_WORKER_PROBE_DIR)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = {p.pid for p in psutil.Process(worker.process.pid).children()}
        for path in folder.glob("worker-*.alive"):
            try:
                state, pid = path.read_text().split()
            except (FileNotFoundError, ValueError):
                continue
            if int(pid) in children and state == "ready":
                return int(pid), path
        time.sleep(0.2)
    raise AssertionError(f"no ready probe file of {worker.name}'s child in {folder}")


def _wait(what: str, node: str, max_age: float, rc: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (done := _probe(what, node, max_age)).returncode != rc:
        assert time.monotonic() < deadline, done.stdout + done.stderr[-1000:]
        time.sleep(0.5)


def test_a_worker_is_ready_live_through_a_redis_restart_and_not_live_when_frozen(
    stack: Any, synth_worker: Any
) -> None:
    pid, path = _child_file(synth_worker)
    node = path.name[len("worker-") : path.name.rindex("-")]
    interval = settings.TTS_HEARTBEAT_INTERVAL
    max_age = 3 * interval + 1
    assert _probe("ready", node, max_age).returncode == 0
    assert _probe("live", node, max_age).returncode == 0

    redis = next(s for s in stack.sup.services if s.name == "redis")
    stack.stop_service(redis)  # SIGTERM: a Redis restart
    try:
        time.sleep(max_age + interval)  # longer than a file may age: it was rewritten meanwhile
        assert _probe("live", node, max_age).returncode == 0, path.read_text()
        assert _probe("ready", node, max_age).returncode == 0
    finally:
        stack.start_service(Service("redis", deploy_stack.redis_command(CFG), ready_port=CFG.redis_port))

    os.kill(pid, signal.SIGSTOP)  # a frozen child: no thread of it runs
    try:
        _wait("live", node, max_age, rc=1)
        assert _probe("ready", node, max_age).returncode == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait("live", node, max_age, rc=0)
    _wait("ready", node, max_age, rc=0)
