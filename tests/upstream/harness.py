"""Running the fake vLLM-Omni upstream (tests/upstream/server.py) from tests: a process per replica."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.stack import spare_port

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"


def prepare_clients() -> Path:
    """.venv-clients, made (or remade, when tests/clients/requirements.lock changed) as the dialect
    tests do; the calling test is skipped when it cannot be made."""
    done = subprocess.run(
        [str(ROOT / "tests" / "clients" / "prepare.sh")], capture_output=True, text=True, timeout=600
    )
    if not CLIENTS_PYTHON.exists():
        pytest.skip(
            f".venv-clients is missing and tests/clients/prepare.sh could not make it: {done.stderr[-500:]}"
        )
    return CLIENTS_PYTHON


@dataclass
class Upstream:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def control(self, **switches: Any) -> dict[str, Any]:
        response = requests.post(f"{self.url}/_control", json=switches, timeout=5)
        response.raise_for_status()
        return dict(response.json())

    def stats(self) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/_stats", timeout=5).json())

    def record(self, request_id: str) -> dict[str, Any]:
        (found,) = [r for r in self.stats()["requests"] if r["id"] == request_id]
        return dict(found)

    def speech(self, body: dict[str, Any], **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        return requests.post(f"{self.url}/v1/audio/speech", json=body, **kwargs)

    def stop(self) -> int:
        """SIGTERM, and the exit status (it stops within seconds, hung requests or not)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def start_upstream(log: Path, *options: str) -> Upstream:
    port = spare_port()
    command = [str(CLIENTS_PYTHON), "-m", "tests.upstream.server", "--host", "127.0.0.1", "--port", str(port)]
    # Its output goes to a file: a pipe nobody reads would fill and stall the server.
    with log.open("wb") as out:
        process = subprocess.Popen([*command, *options], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    upstream = Upstream(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the fake upstream exited with {process.returncode}:\n{log.read_text()}")
        try:
            if requests.get(f"{upstream.url}/health", timeout=1).status_code == 200:
                return upstream
        except requests.ConnectionError:
            time.sleep(0.05)
    process.kill()
    pytest.fail(f"the fake upstream did not answer /health in 15 s:\n{log.read_text()}")
