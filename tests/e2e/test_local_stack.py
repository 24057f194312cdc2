"""`make run`'s stack for real: up, healthy through Nginx, as the app user (a voice upload becomes ready),
clean stop, data reused, port errors, Ctrl-C while starting."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests import prompt_files
from tests.e2e.local_stack import StackProcess, api_session, listening, stack_env

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var" / "test-local-stack"
PORTS = {
    "TTS_PG_PORT": "15440",
    "TTS_REDIS_PORT": "16440",
    "TTS_HTTP_PORT": "18440",
    "TTS_HTTPS_PORT": "18441",
}


class Stack(StackProcess):
    def __init__(self, **extra: str) -> None:
        super().__init__(VAR, PORTS, **extra)


# The first analysis on a new machine profiles every English built-in voice (then caches them):
# on 2 loaded cores that took 3 minutes, past the default limit.
ANALYSIS_SECONDS = 540


def _env() -> dict[str, str]:
    return stack_env(VAR, PORTS)


def _listening(port: str) -> bool:
    return listening(port)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _assert_least_privilege() -> None:
    """Nothing of var/ is world-readable or writable that need not be; as root, Nginx's folders are its own."""
    assert _mode(VAR / "run" / "gunicorn.sock") == 0o660
    for folder in ("media", "log", "tmp", "secrets"):
        assert _mode(VAR / folder) & 0o006 == 0, folder
    for name in ("pg_password", "pg_admin_password", "redis_password", "django_secret_key", "api_key_secret"):
        assert _mode(VAR / "secrets" / name) == 0o600, name
    assert _mode(VAR / "redis" / "redis.conf") == 0o600
    assert _mode(VAR / "tls" / "key.pem") == 0o600
    if os.geteuid() == 0:
        temp = VAR / "nginx" / "tmp" / "client_body"
        assert (temp.owner(), _mode(temp)) == ("nobody", 0o700)
        assert (VAR / "media").owner() == "tts-app" and (VAR / "media").group() == "tts-app"


def _assert_nginx_group_can_write_nothing() -> None:
    """As root, Nginx's workers share the app user's group (to reach the socket and read audio):
    that group writes nothing under var/ but the socket, voice prompts and var/run included."""
    from deploy.privileges import APP_SYSTEM_USER

    if os.geteuid() != 0:
        return
    writable = [
        str(path.relative_to(VAR))
        for path in [VAR, *VAR.rglob("*")]
        if path.stat().st_mode & stat.S_IWGRP and path.group() == APP_SYSTEM_USER
    ]
    assert writable == ["run/gunicorn.sock"], writable
    prompts = list((VAR / "media" / "voices").rglob("*.wav"))
    assert prompts and all(_mode(prompt) & 0o027 == 0 for prompt in prompts), [_mode(p) for p in prompts]


def _assert_django_runs_unprivileged(stack: Stack) -> None:
    """As root, gunicorn's workers, Celery and beat run as the app user (the gunicorn master binds
    the socket and stays root). A Python or checkout that user cannot read makes the stack fall back
    to root, and this test fail: a root run would hide every folder the app user cannot write."""
    import psutil

    from deploy.privileges import APP_SYSTEM_USER, others_can_use

    if os.geteuid() != 0:
        return
    python = Path(sys.executable).resolve()
    assert others_can_use(python) and others_can_use(ROOT), (
        f"{APP_SYSTEM_USER} cannot run {python} or read {ROOT}: the stack would run the app as root. "
        "Run the tests from a checkout and a .venv other users can enter (deploy/bootstrap.sh builds "
        ".venv on /usr/bin/python3.11 when the default Python is in a private folder)"
    )
    assert "so gunicorn and Celery run as root" not in stack.output, stack.output[-2000:]
    # Keyed by pid: the command lines of a worker's children, or of two gunicorn workers, are the
    # same, and a longer checkout path makes any prefix of them the same too.
    owners: dict[int, tuple[str, str]] = {}
    for proc in psutil.Process(stack.proc.pid).children(recursive=True):
        try:
            command = " ".join(proc.cmdline())
            parent_proc = proc.parent()
            assert parent_proc is not None  # a child of the stack's process tree
            parent = " ".join(parent_proc.cmdline())
        except psutil.NoSuchProcess:  # a short-lived child (a zombie is one too) that is gone
            continue
        if "celery" in command or ("gunicorn" in command and "gunicorn" in parent):
            owners[proc.pid] = (command[-80:], proc.username())
    assert len(owners) >= 4, owners  # 2 gunicorn workers, the worker's parent, its children, beat...
    assert {user for _, user in owners.values()} == {APP_SYSTEM_USER}, owners
    assert any("-n analysis@" in command for command, _ in owners.values()), owners


def _assert_a_voice_upload_becomes_ready(stack: Stack, key: str, tmp: Path) -> None:
    """The first upload of a new machine: stored by gunicorn's worker, analysed by the analysis
    worker (which writes the voice-profile cache and temporary WAVs), each as the app user."""
    prompt = prompt_files.flite("slt", tmp / "stella.wav")
    session = api_session(key)
    with prompt.open("rb") as fh:
        response = session.post(
            stack.url("/api/v1/voices"),
            data={"name": "Stella", "consent": "true", "transcript": prompt_files.PROMPT_SENTENCE},
            files={"audio": ("stella.wav", fh, "audio/wav")},
            timeout=60,
        )
    assert response.status_code == 202, response.text[:500]
    voice_url = stack.url(f"/api/v1/voices/{response.json()['id']}")
    deadline = time.monotonic() + ANALYSIS_SECONDS
    while True:
        voice = session.get(voice_url, timeout=10).json()
        if voice["status"] != "processing" or time.monotonic() > deadline:
            break
        time.sleep(1)
    analysis_log = (VAR / "log" / "analysis.log").read_text(errors="replace")[-3000:]
    assert voice["status"] == "ready", f"{voice}\n{analysis_log}"
    assert "PermissionError" not in analysis_log, analysis_log


# Two stack starts and a voice's first analysis: on 2 loaded cores that took 10 minutes.
@pytest.mark.timeout(1500)
def test_run_serves_as_the_app_user_stops_cleanly_and_reuses_data(tmp_path: Path) -> None:
    shutil.rmtree(VAR, ignore_errors=True)  # a first run, as on a new machine
    first = Stack(TTS_ANALYSIS_TIME_LIMIT_SECONDS=str(ANALYSIS_SECONDS * 5 // 4 + 30))  # soft limit: 80 %
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
        _assert_least_privilege()
        _assert_django_runs_unprivileged(first)
        _assert_a_voice_upload_becomes_ready(first, key.group(1), tmp_path)
        _assert_nginx_group_can_write_nothing()
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


def test_ctrl_c_during_start_up_stops_what_has_started() -> None:
    stack = Stack()
    try:
        # PostgreSQL is up (its pid file is written) long before the rest: interrupt there.
        pid_file = VAR / "run" / "postgres.pid"
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert stack.proc.poll() is None, stack.output[-3000:]
            assert time.monotonic() < deadline, "PostgreSQL never started"
            time.sleep(0.1)
        postgres = json.loads(pid_file.read_text())["pid"]
        started = time.monotonic()
        status = stack.interrupt()
        took = time.monotonic() - started
    finally:
        if stack.proc.poll() is None:
            os.killpg(stack.proc.pid, signal.SIGKILL)
    assert status == 0, stack.output[-3000:]
    # Without the fix the stack finished starting everything (a minute here) before stopping.
    assert took < 20, f"took {took:.0f}s to stop\n{stack.output[-3000:]}"
    assert "stack: stopped" in stack.output
    assert "The service is up" not in stack.output
    assert not Path(f"/proc/{postgres}").exists()
    for port in PORTS.values():
        assert not _listening(port), f"port {port} still open after Ctrl-C during start-up"
