"""`python -m deploy.stack run` as a child process, for the tests of `make run`'s stack."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
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
