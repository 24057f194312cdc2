"""`make run`'s stack for real: up, healthy through Nginx, clean stop, data reused, port errors."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
import urllib3

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var" / "test-local-stack"
PORTS = {
    "TTS_PG_PORT": "55440",
    "TTS_REDIS_PORT": "56440",
    "TTS_HTTP_PORT": "18440",
    "TTS_HTTPS_PORT": "18441",
}

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TTS_", "DJANGO_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update(PORTS)
    env.update({"TTS_VAR_DIR": str(VAR), "PYTHONUNBUFFERED": "1", "TTS_GUNICORN_WORKERS": "1"})
    return env


class Stack:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.stack", "run"],
            cwd=ROOT,
            env=_env(),
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

    def wait_healthy(self, timeout: float = 180) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output[-3000:]
            try:
                response = requests.get(
                    f"https://127.0.0.1:{PORTS['TTS_HTTPS_PORT']}/healthz", verify=False, timeout=5
                )
                last = response.text
                if response.status_code == 200:
                    return response.json()  # type: ignore[no-any-return]
            except requests.ConnectionError as exc:
                last = exc
            time.sleep(1)
        raise AssertionError(f"not healthy in {timeout}s: {last}\n{self.output[-3000:]}")

    def interrupt(self) -> int:
        os.kill(self.proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        return self.proc.wait(120)


def _listening(port: str) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", int(port))) == 0


def test_run_serves_stops_cleanly_and_reuses_data() -> None:
    shutil.rmtree(VAR, ignore_errors=True)  # a first run, as on a new machine
    first = Stack()
    try:
        body = first.wait_healthy()
        assert body["checks"] == {"db": "ok", "redis": "ok", "workers": "ok"}
        assert f"https://localhost:{PORTS['TTS_HTTPS_PORT']}" in first.output
        key = re.search(r"API key\s+(tts_[A-Za-z0-9]{8}_\S+)", first.output)
        assert key, first.output[-2000:]
        assert re.search(r"password\s+\S{12,}", first.output)

        # HTTP redirects to HTTPS and keeps the port.
        redirect = requests.get(
            f"http://127.0.0.1:{PORTS['TTS_HTTP_PORT']}/healthz", allow_redirects=False, timeout=5
        )
        assert redirect.status_code == 301
        assert redirect.headers["Location"] == f"https://127.0.0.1:{PORTS['TTS_HTTPS_PORT']}/healthz"

        for name in ("postgres", "redis", "gunicorn", "worker", "beat", "nginx"):
            assert (VAR / "log" / f"{name}.log").stat().st_size > 0, name
    finally:
        status = first.interrupt()
    assert status == 0, first.output[-3000:]
    assert "stack: stopped" in first.output
    for port in PORTS.values():
        assert not _listening(port), f"port {port} still open after Ctrl-C"

    second = Stack()
    try:
        second.wait_healthy()
        assert "Demo tenant exists" in second.output
        assert "API key" not in second.output  # shown once, never again
        # The key created by the first run still authenticates: data was reused.
        from_first = key.group(1)
        response = requests.get(
            f"https://127.0.0.1:{PORTS['TTS_HTTPS_PORT']}/api/v1/usage",
            headers={"Authorization": f"Bearer {from_first}"},
            verify=False,
            timeout=10,
        )
        assert response.status_code == 200, response.text
    finally:
        # `make stop` from another shell stops a running `make run`.
        stop = subprocess.run(
            [sys.executable, "-m", "deploy.stack", "stop"],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert second.proc.wait(30) == 0
    for port in PORTS.values():
        assert not _listening(port), f"port {port} still open after make stop"


def test_a_port_in_use_is_a_one_line_error_naming_the_variable() -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", int(PORTS["TTS_HTTPS_PORT"])))
        busy.listen()
        result = subprocess.run(
            [sys.executable, "-m", "deploy.stack", "run"],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "in use" in line]
    assert lines == [
        f"stack: port {PORTS['TTS_HTTPS_PORT']} is already in use; set TTS_HTTPS_PORT to use another port"
    ]
