"""The web tier says at start which sandbox its voice-upload decode children run in (synth/prompt.py)."""

from __future__ import annotations

import time
from typing import Any

from synth.prompt import sandbox_mode
from tests.stack import CFG


def test_each_gunicorn_worker_logs_the_sandbox_its_decode_children_get(web: Any) -> None:
    expected = sandbox_mode("auto")  # what this host allows the same user
    log = CFG.log_dir / "gunicorn.log"
    deadline = time.monotonic() + 30
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if "voice uploads decode" in line]
        if len(lines) >= 2:  # TTS_GUNICORN_WORKERS=2: one line per worker, as it starts
            break
        time.sleep(0.2)
    assert len(lines) >= 2, lines
    if expected == "limits":
        assert all("resource limits only" in line for line in lines), lines
    else:
        assert all(f"in a sandbox: {expected}" in line for line in lines), lines
