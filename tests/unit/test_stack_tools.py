"""The stack's own tools: log rotation, restarts, warm stop, stop after a lost supervisor, bootstrap, make clean."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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


def _unit_cfg(tmp_path: Path) -> StackConfig:
    return StackConfig(var_dir=tmp_path, pg_port=1, redis_port=2, http_port=3, https_port=4, name="unit")


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _recorded_pid(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["pid"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


def test_a_service_that_dies_is_restarted(tmp_path: Path) -> None:
    sup = Supervisor(_unit_cfg(tmp_path), echo=False)
    service = sup.start(Service("sleeper", ["sleep", "300"]))
    assert service.process is not None
    first = service.process.pid
    watcher = threading.Thread(target=sup.watch, daemon=True)
    watcher.start()
    try:
        os.kill(first, signal.SIGKILL)
        _wait(
            lambda: (
                service.process is not None
                and service.process.pid != first
                and service.process.poll() is None
            ),
            10,
            "the restart",
        )
        assert service.process is not None
        restarted = service.process.pid
        # The pid file follows the new process (written just after it starts).
        _wait(lambda: _recorded_pid(tmp_path / "run" / "sleeper.pid") == restarted, 10, "the new pid file")
    finally:
        sup.stopping.set()
        watcher.join(5)
        sup.stop_all(timeout=5)
    assert not (tmp_path / "run" / "sleeper.pid").exists()


def test_a_service_that_keeps_crashing_is_given_up_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sup = Supervisor(_unit_cfg(tmp_path), echo=False)
    sup.backoff_base = 0.05
    sup.max_crashes = 4
    runs = tmp_path / "runs"
    sup.start(Service("crasher", ["sh", "-c", f"echo run >> {runs}; exit 3"]))
    started = time.monotonic()
    assert sup.watch() == 1
    # Backoff doubles: 0.05 + 0.1 + 0.2 s between the four runs.
    assert time.monotonic() - started >= 0.35
    assert runs.read_text().count("run") == 4
    out = capsys.readouterr().out
    assert "crasher exited with status 3; restarting in 0.05 s" in out
    assert "crasher exited 4 times within 120 s (last status 3); giving up." in out


# A parent that, on SIGTERM, waits for its child's job to finish: a Celery worker's warm shutdown.
WARM_PARENT = """
import signal, subprocess, sys, time
child = subprocess.Popen(["sh", "-c", "sleep 1.5; echo finished > " + sys.argv[1]])
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(True))
print("ready", flush=True)
while not asked:
    time.sleep(0.05)
sys.exit(child.wait())
"""


@pytest.mark.parametrize(("group", "finished"), [(False, True), (True, False)])
def test_a_warm_stop_signals_only_the_parent(tmp_path: Path, group: bool, finished: bool) -> None:
    sup = Supervisor(_unit_cfg(tmp_path), echo=False)
    marker = tmp_path / "job"
    service = sup.start(Service("worker", [sys.executable, "-c", WARM_PARENT, str(marker)], stop_group=group))
    _wait(
        lambda: (
            (tmp_path / "log" / "worker.log").exists()
            and "ready" in (tmp_path / "log" / "worker.log").read_text()
        ),
        10,
        "ready",
    )
    sup.stop_all(timeout=10)
    assert service.process is not None and service.process.poll() is not None
    # Only the parent signalled: the running "job" finished. The whole group: it was cut off.
    assert marker.exists() is finished


SUPERVISOR_ALONE = """
import sys, time
from pathlib import Path
from deploy.stack import Service, StackConfig, Supervisor
cfg = StackConfig(var_dir=Path(sys.argv[1]), pg_port=1, redis_port=2, http_port=3, https_port=4, name="unit")
sup = Supervisor(cfg, echo=False)
service = sup.start(Service("sleeper", ["sleep", "300"]))
print(service.process.pid, flush=True)
time.sleep(300)
"""


def test_stop_finds_the_services_of_a_killed_supervisor(tmp_path: Path) -> None:
    from deploy.stack import cmd_stop

    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR_ALONE, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert supervisor.stdout is not None
    sleeper = int(supervisor.stdout.readline())
    supervisor.kill()
    supervisor.wait(10)
    assert Path(f"/proc/{sleeper}").exists()  # orphaned, still running
    assert cmd_stop(_unit_cfg(tmp_path)) == 0
    _wait(lambda: not Path(f"/proc/{sleeper}").exists(), 10, "the orphan to be stopped")
    assert not (tmp_path / "run" / "sleeper.pid").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root")
def test_the_app_user_runs_django_processes_with_a_private_umask(tmp_path: Path) -> None:
    from deploy.privileges import APP_SYSTEM_USER, app_user, as_user

    user = app_user()
    assert user is not None and user.pw_name == APP_SYSTEM_USER
    sup = Supervisor(_unit_cfg(tmp_path), echo=False)
    # What as_app_user() gives a Celery process of `make run` (system Python: any user may run it).
    kwargs = {**as_user(user), "umask": 0o027}
    code = "import os; print('ids', os.geteuid(), os.getegid(), oct(os.umask(0)))"
    service = sup.start(Service("whoami", ["/usr/bin/python3", "-c", code], popen_kwargs=kwargs))
    assert service.process is not None and service.process.wait(20) == 0
    log = tmp_path / "log" / "whoami.log"
    _wait(lambda: log.exists() and "ids" in log.read_text(), 10, "the output")
    assert f"ids {user.pw_uid} {user.pw_gid} 0o27" in log.read_text()


def test_every_fixed_port_lies_below_the_kernels_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux hands out 32768-60999 to outgoing connections; a long-lived one (a worker's Redis
    connection) can hold a port there for minutes, and a stack that wants to listen on it fails.
    CI failed that way once on 55440, so our listening ports stay below the range."""
    from tests.bench.bench_soak import PORTS as SOAK
    from tests.e2e.test_local_stack import PORTS as LOCAL
    from tests.e2e.test_stack_recovery import PORTS as RECOVERY
    from tests.stack import SPARE_PORTS, spare_port

    for name in [*StackConfig.from_env().port_vars.values(), *StackConfig.for_tests().port_vars.values()]:
        monkeypatch.delenv(name, raising=False)
    configs = [StackConfig.from_env(), StackConfig.for_tests()]
    ports = [getattr(cfg, attr) for cfg in configs for attr in cfg.port_vars]
    ports += [int(port) for fixed in (LOCAL, RECOVERY, SOAK) for port in fixed.values()]
    low = 32768
    range_file = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if range_file.exists():
        low = min(low, int(range_file.read_text().split()[0]))
    assert all(0 < port < low for port in ports), sorted(ports)
    assert len(set(ports)) == len(ports)  # and no two stacks share one
    # The spare ports extra listeners draw from lie below the range too, clear of every fixed one.
    assert 0 < SPARE_PORTS[0] and SPARE_PORTS[-1] < low
    assert not set(ports) & set(SPARE_PORTS)
    assert all(spare_port() in SPARE_PORTS for _ in range(20))


def test_postgres_is_told_its_port_on_every_start(tmp_path: Path) -> None:
    """The cluster's config keeps the port it was created with; the command line wins, so a
    changed TTS_PG_PORT (or a new default) applies to an existing var/."""
    from deploy.provision import postgres_command

    cfg = StackConfig(var_dir=tmp_path, pg_port=15999, redis_port=0, http_port=0, https_port=0)
    command, _ = postgres_command(cfg)
    assert command[-2:] == ["-p", "15999"]
