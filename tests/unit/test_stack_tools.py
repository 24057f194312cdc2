"""The stack's own tools: log rotation, bootstrap without root, make clean's guard."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.stack import Service, StackConfig, Supervisor

ROOT = Path(__file__).resolve().parents[2]


def test_process_logs_go_to_stdout_and_a_size_rotated_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTS_LOG_MAX_BYTES", "2000")
    cfg = StackConfig(var_dir=tmp_path, pg_port=1, redis_port=2, http_port=3, https_port=4, name="unit")
    sup = Supervisor(cfg, echo=False)
    service = sup.start(Service("chatty", [sys.executable, "-c", "for i in range(400): print('line', i)"]))
    assert service.process is not None
    service.process.wait(30)
    deadline = 50
    while deadline and not (tmp_path / "log" / "chatty.log.1").exists():
        deadline -= 1
        import time

        time.sleep(0.1)
    logs = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert "chatty.log" in logs and "chatty.log.1" in logs
    assert (tmp_path / "log" / "chatty.log").stat().st_size <= 2100


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root to switch user")
def test_bootstrap_without_root_prints_the_apt_line_and_fails() -> None:
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", "bash", str(ROOT / "deploy" / "bootstrap.sh")],
        env={**os.environ, "TTS_BOOTSTRAP_PACKAGES": "postgresql tts-no-such-package"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "apt-get install -y tts-no-such-package" in result.stdout
    assert (
        "postgresql" not in result.stdout.split("apt-get install -y", 1)[1]
    )  # installed ones are not listed


def test_make_clean_without_confirm_removes_nothing() -> None:
    marker = ROOT / "var" / "clean-guard-marker"
    marker.parent.mkdir(exist_ok=True)
    marker.write_text("keep")
    try:
        result = subprocess.run(["make", "-s", "clean"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0
        assert "CONFIRM=1" in result.stdout
        assert marker.exists()
    finally:
        marker.unlink()
