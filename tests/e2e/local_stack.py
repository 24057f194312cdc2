"""`python -m deploy.stack run` as a child process, for the tests of `make run`'s stack."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import requests
import urllib3

ROOT = Path(__file__).resolve().parents[2]

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def stack_env(var: Path, ports: dict[str, str], **extra: str) -> dict[str, str]:
    """The machine's environment without our settings, plus this stack's folder and ports."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TTS_", "DJANGO_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update(ports)
    env.update({"TTS_VAR_DIR": str(var), "PYTHONUNBUFFERED": "1", "TTS_GUNICORN_WORKERS": "1"})
    env.update(extra)
    return env


def listening(port: str) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", int(port))) == 0


class StackProcess:
    def __init__(self, var: Path, ports: dict[str, str], **extra: str) -> None:
        self.var = var
        self.ports = ports
        self.env = stack_env(var, ports, **extra)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.stack", "run"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace"))

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.ports['TTS_HTTPS_PORT']}{path}"

    def wait_healthy(self, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output[-3000:]
            try:
                response = requests.get(self.url("/healthz"), verify=False, timeout=5)
                last = response.text
                if response.status_code == 200:
                    return response.json()  # type: ignore[no-any-return]
            except requests.RequestException as exc:
                last = exc
            time.sleep(1)
        raise AssertionError(f"not healthy in {timeout}s: {last}\n{self.output[-3000:]}")

    def interrupt(self) -> int:
        # A stack that already failed on its own keeps that failure the one reported.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        return self.proc.wait(150)

    def stop_command(self) -> subprocess.CompletedProcess[str]:
        """`make stop` from another shell."""
        return subprocess.run(
            [sys.executable, "-m", "deploy.stack", "stop"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=200,
        )

    def kill_all(self) -> None:
        """Last resort after a failed test: the supervisor, then what its pid files name."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.stop_command()


# Short housekeeping periods and leases: a job whose worker child was killed
# (or whose message was lost with a killed worker parent) is reaped and
# re-dispatched within seconds, not minutes.
FAST_RECOVERY_ENV = {
    "TTS_WORKER_ENGINES": "espeak",
    "TTS_HEARTBEAT_INTERVAL": "1",
    "TTS_HEARTBEAT_TTL": "4",
    "TTS_JOB_LEASE_SECONDS": "8",
    "TTS_DISPATCH_GRACE_SECONDS": "3",
    "TTS_HOUSEKEEPING_EVERY_REAP_STUCK_JOBS": "3",
    "TTS_HOUSEKEEPING_EVERY_REDISPATCH_JOBS": "3",
    "TTS_JOB_REDELIVER_SECONDS": "15",
    "TTS_HOUSEKEEPING_EVERY_SWEEP_LOST_DELIVERIES": "3",
}


def service_pid(var: Path, name: str) -> int:
    """The pid the supervisor wrote for a service (var/run/<name>.pid)."""
    return int(json.loads((var / "run" / f"{name}.pid").read_text())["pid"])


def api_session(key: str) -> requests.Session:
    session = requests.Session()
    # REQUESTS_CA_BUNDLE and proxy variables of the machine must not replace our settings.
    session.trust_env = False
    session.verify = False
    session.headers["Authorization"] = f"Bearer {key}"
    return session


def submit_until_accepted(stack: StackProcess, session: requests.Session, text: str) -> tuple[str, int]:
    """POST one eSpeak job, retried with the same Idempotency-Key through outages; (id, refusals)."""
    idem = str(uuid.uuid4())
    body = {"text": text, "voice": "espeak-en-us", "format": "wav"}
    refusals = 0
    while True:
        try:
            response = session.post(
                stack.url("/api/v1/speech"), json=body, headers={"Idempotency-Key": idem}, timeout=30
            )
            if response.status_code in (200, 201, 202):
                return str(response.json()["id"]), refusals
            # An outage answers 502/503 (or a busy plan 429); anything else is a bug.
            assert response.status_code >= 500 or response.status_code == 429, response.text[:300]
        except requests.RequestException:
            pass
        refusals += 1
        time.sleep(0.5)
