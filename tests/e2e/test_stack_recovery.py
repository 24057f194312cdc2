"""Nothing needs a manual restart: `kill -9` of each service of `make run`'s stack while jobs stream in.

Each service comes back by itself (the supervisor restarts it), /healthz
returns to 200, and every job submitted succeeds, charged once.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.e2e.local_stack import (
    FAST_RECOVERY_ENV,
    StackProcess,
    api_session,
    service_pid,
    submit_until_accepted,
)

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var" / "test-stack-recovery"
PORTS = {
    "TTS_PG_PORT": "15446",
    "TTS_REDIS_PORT": "16446",
    "TTS_HTTP_PORT": "18446",
    "TTS_HTTPS_PORT": "18447",
}
FAST_RECOVERY = {**FAST_RECOVERY_ENV, "TTS_WORKER_CONCURRENCY": "1"}
SERVICES = ("redis", "postgres", "gunicorn", "worker", "beat", "nginx")


class JobStream:
    """Submits a short eSpeak job every second; retries each with its Idempotency-Key until accepted."""

    def __init__(self, stack: StackProcess, key: str) -> None:
        self.stack = stack
        self.session = api_session(key)
        self.accepted: list[str] = []
        self.refusals = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _submit(self, n: int) -> None:
        job_id, refusals = submit_until_accepted(self.stack, self.session, f"Job number {n} streams in.")
        self.accepted.append(job_id)
        self.refusals += refusals

    def _run(self) -> None:
        n = 0
        try:
            while not self.stopping.is_set():
                n += 1
                self._submit(n)
                time.sleep(1.0)
        except BaseException as exc:  # handed to the test in stop()
            self.error = exc

    def stop(self) -> list[str]:
        self.stopping.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error
        return self.accepted


def _pid(name: str) -> int:
    return service_pid(VAR, name)


def _wait_restarted(name: str, old: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = _pid(name)
        except (FileNotFoundError, ValueError):
            pid = old
        if pid != old and Path(f"/proc/{pid}").exists():
            return pid
        time.sleep(0.2)
    raise AssertionError(f"{name} was not restarted within {timeout}s")


def _final_states(stack: StackProcess, key: str, ids: list[str], timeout: float) -> dict[str, str]:
    session = api_session(key)
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for job_id in ids:
            if states.get(job_id) not in ("succeeded", "failed", "canceled"):
                response = session.get(stack.url(f"/api/v1/speech/{job_id}"), timeout=15)
                states[job_id] = response.json()["status"]
        if all(states.get(i) in ("succeeded", "failed", "canceled") for i in ids):
            break
        time.sleep(1)
    return states


def _ledger(ids: list[str]) -> dict[str, list[str]]:
    password = (VAR / "secrets" / "pg_password").read_text().strip()
    dsn = f"postgresql://tts:{password}@127.0.0.1:{PORTS['TTS_PG_PORT']}/tts"
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT job_key::text, kind FROM speech_usageevent WHERE job_key::text = ANY(%s) ORDER BY kind",
            (ids,),
        ).fetchall()
    ledger: dict[str, list[str]] = {i: [] for i in ids}
    for job_key, kind in rows:
        ledger[job_key].append(kind)
    return ledger


@pytest.mark.slow
def test_every_service_comes_back_by_itself_and_no_job_is_lost() -> None:
    shutil.rmtree(VAR, ignore_errors=True)
    stack = StackProcess(VAR, PORTS, **FAST_RECOVERY)
    try:
        stack.wait_healthy(240)
        found = re.search(r"API key\s+(tts_[A-Za-z0-9]{8}_\S+)", stack.output)
        assert found, stack.output[-2000:]
        key = found.group(1)
        stream = JobStream(stack, key)
        stream.thread.start()
        for name in SERVICES:
            old = _pid(name)
            time.sleep(3)  # jobs in flight when it dies
            os.kill(old, signal.SIGKILL)
            _wait_restarted(name, old)
            stack.wait_healthy(90)
        time.sleep(2)
        ids = stream.stop()
        assert len(ids) >= 10, f"only {len(ids)} jobs went in"
        states = _final_states(stack, key, ids, timeout=120)
        assert {s for s in states.values()} == {"succeeded"}, states
        ledger = _ledger(ids)
        assert all(kinds == ["charge", "reserve"] for kinds in ledger.values()), ledger
        for name in SERVICES:
            assert f"stack: {name} exited with status -9; restarting" in stack.output
        assert "giving up" not in stack.output
    finally:
        stop = stack.stop_command()
        if stack.proc.poll() is None:
            stack.kill_all()
    assert stop.returncode == 0, stop.stdout + stop.stderr
