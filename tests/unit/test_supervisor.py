"""The local supervisor with real processes: its log pump outlives a broken or full output, and a
crash-looping optional service is held back while the required ones keep running."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from deploy.stack import Service, StackConfig, Supervisor

# More than a pipe's buffer (64 KiB on Linux) after the first failed write: a pump that died
# there leaves the child blocked in write() long before it gets to the end.
LINES = 3000
CHATTY = f"""
import sys, time
for i in range({LINES}):
    print("line", i, "x" * 100, flush=True)
print("wrote all", flush=True)
open(sys.argv[1], "w").close()
time.sleep(30)
"""


def _cfg(tmp_path: Path) -> StackConfig:
    return StackConfig(var_dir=tmp_path, pg_port=1, redis_port=2, http_port=3, https_port=4, name="unit")


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def broken_pipe() -> Iterator[IO[str]]:
    """A stdout whose reader is gone (`make run | head` after head exits): every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    out = os.fdopen(write_end, "w")
    yield out
    try:
        out.close()
    except BrokenPipeError:
        pass


@pytest.fixture
def full_disk() -> Iterator[IO[str]]:
    """A stdout on a full filesystem (`make run > file` on a full disk): /dev/full answers ENOSPC."""
    with open("/dev/full", "w") as out:
        yield out
        try:
            out.close()
        except OSError:
            pass


def _run_chatty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: IO[str], log_on_full_disk: bool
) -> tuple[Supervisor, Service]:
    monkeypatch.setattr(sys, "stdout", stdout)
    (tmp_path / "log").mkdir()
    if log_on_full_disk:
        (tmp_path / "log" / "chatty.log").symlink_to("/dev/full")
    sup = Supervisor(_cfg(tmp_path), echo=True)
    done = tmp_path / "done"
    service = sup.start(Service("chatty", [sys.executable, "-c", CHATTY, str(done)]))
    try:
        _wait(done.exists, 30, f"the child to write all its {LINES} lines (a dead pump blocks it)")
        assert service.process is not None and service.process.poll() is None
    except BaseException:
        monkeypatch.undo()
        sup.stop_all(timeout=5)
        raise
    return sup, service


@pytest.mark.parametrize("target", ["broken_pipe", "full_disk"])
def test_the_log_pump_outlives_a_broken_or_full_stdout(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    target: str,
) -> None:
    stdout: IO[str] = request.getfixturevalue(target)
    sup, _service = _run_chatty(tmp_path, monkeypatch, stdout, log_on_full_disk=False)
    try:
        log = tmp_path / "log" / "chatty.log"
        # The file still gets every line, also those after stdout failed.
        _wait(lambda: "wrote all" in log.read_text(), 10, "the last line in the log file")
        assert log.read_text().count("line ") == LINES
    finally:
        monkeypatch.undo()
        sup.stop_all(timeout=5)
    said = [line for line in capsys.readouterr().err.splitlines() if "cannot write to stdout" in line]
    assert len(said) == 1 and f"output goes on to {tmp_path / 'log'} only" in said[0], said


def test_the_log_pump_outlives_a_full_log_disk_and_a_broken_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], broken_pipe: IO[str]
) -> None:
    sup, _service = _run_chatty(tmp_path, monkeypatch, broken_pipe, log_on_full_disk=True)
    monkeypatch.undo()
    sup.stop_all(timeout=5)
    err = capsys.readouterr().err
    # Once each, not a traceback per lost line.
    assert err.count("cannot write to stdout") == 1, err[-2000:]
    assert (
        err.count(f"cannot write {tmp_path / 'log' / 'chatty.log'} ([Errno 28] No space left on device)") == 1
    )
    assert "Traceback" not in err, err[-2000:]


def test_a_crash_looping_optional_service_is_held_back_while_the_rest_keeps_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sup = Supervisor(_cfg(tmp_path), echo=False)
    sup.backoff_base = 0.05
    sup.max_crashes = 3
    runs = tmp_path / "runs"
    required = sup.start(Service("web", ["sleep", "300"]))
    assert required.process is not None
    web_pid = required.process.pid
    crasher = Service(
        "analysis",
        ["sh", "-c", f"echo run >> {runs}; exit 3"],
        required=False,
        missing_means="voice uploads stay processing",
    )
    sup.start(crasher)
    watcher = threading.Thread(target=sup.watch, daemon=True)
    watcher.start()
    try:
        _wait(lambda: "holding it back" in capsys.readouterr().out or not watcher.is_alive(), 10, "the hold")
        # Another few looks of the watch loop (every 0.2 s): nothing restarts the held service.
        time.sleep(1.0)
        assert watcher.is_alive(), "the stack stopped for an optional service"
        assert runs.read_text().count("run") == 3
        assert required.process.poll() is None and required.process.pid == web_pid
    finally:
        sup.stopping.set()
        watcher.join(5)
        sup.stop_all(timeout=5)


def test_the_hold_message_names_the_service_its_log_and_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sup = Supervisor(_cfg(tmp_path), echo=False)
    sup.backoff_base = 0.05
    sup.max_crashes = 2
    sup.hold_seconds = 0.5
    runs = tmp_path / "runs"
    sup.start(
        Service(
            "analysis",
            ["sh", "-c", f"echo run >> {runs}; exit 3"],
            required=False,
            missing_means="voice uploads stay processing",
        )
    )
    watcher = threading.Thread(target=sup.watch, daemon=True)
    watcher.start()
    try:
        # Held back, then tried again after the hold with a fresh count: two more runs.
        _wait(lambda: runs.exists() and runs.read_text().count("run") >= 4, 10, "the retry after the hold")
        assert watcher.is_alive()
    finally:
        sup.stopping.set()
        watcher.join(5)
        sup.stop_all(timeout=5)
    out = capsys.readouterr().out
    log = tmp_path / "log" / "analysis.log"
    assert (
        f"analysis exited 2 times within 120 s (last status 3); holding it back for 0.5 s "
        f"(the rest keeps serving; meanwhile voice uploads stay processing). See {log}"
    ) in out


def test_the_stack_serves_without_the_analysis_worker_housekeeping_and_beat(tmp_path: Path) -> None:
    from deploy.stack import app_services, prepare_var

    prepare_var(_cfg(tmp_path))  # the passwords the services' environment names
    services = {service.name: service for service in app_services(_cfg(tmp_path))}
    assert {name for name, service in services.items() if service.required} == {"gunicorn", "worker", "nginx"}
    assert services["analysis"].missing_means == "uploaded voices stay processing"
    assert all(service.missing_means for service in services.values() if not service.required)


def test_a_restarted_service_gets_a_new_log_file_after_a_full_disk(tmp_path: Path) -> None:
    """The old file's last lines cannot be flushed: closing it must not stop the new pump."""
    log = tmp_path / "log" / "chatty.log"
    log.parent.mkdir()
    log.symlink_to("/dev/full")
    sup = Supervisor(_cfg(tmp_path), echo=False)
    sup._logger("chatty").info("lost to the full disk")
    log.unlink()  # room again
    sup._logger("chatty").info("written")  # what the next start's pump does first
    assert log.read_text() == "written\n"
