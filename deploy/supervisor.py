"""The local stack's supervisor: starts services, restarts crashed ones, stops them in order.

Each service runs in its own session (process group), its output teed to stdout
and to var/log/<name>.log (rotated by size); the pump that reads it outlives a stdout
or log file it cannot write (a closed pipe, a full disk), so a service never blocks
on a full pipe. A pid file per service,
var/run/<name>.pid, records how to stop it, so `make stop` can stop the process
groups even when the supervisor itself was killed. Why our own supervisor and
not supervisord: docs/decisions.md ("The local stack's supervisor").
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from deploy.provision import ROOT, StackConfig, StackError, wait_for_port
from deploy.roles import DATA_SERVICES
from webapp.env import env_int

# A service that crashes this many times within the window is given up on (the stack
# stops), or, if the stack serves without it, held back this long before it is tried again.
MAX_CRASHES = 5
CRASH_WINDOW_SECONDS = 120.0
HOLD_SECONDS = 300.0
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


class StackInterrupted(Exception):
    """Ctrl-C or SIGTERM arrived while the stack was still starting."""


@dataclass
class Service:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    popen_kwargs: dict[str, object] = field(default_factory=dict)
    ready_port: int | None = None
    stop_signal: int = signal.SIGTERM
    # Most services stop as a group. A Celery worker is signalled through its
    # parent only: SIGTERM there is a warm shutdown that lets running jobs finish,
    # while SIGTERM to its children would cut them off mid-job.
    stop_group: bool = True
    # Seconds to wait before SIGKILL; None: the stop_all() default.
    stop_timeout: float | None = None
    # Called before every (re)start, e.g. to remove a stale socket.
    before_start: Callable[[], None] | None = None
    # False for a service the stack serves without (the analysis worker): crash-looping, it is
    # held back instead of stopping the stack; ``missing_means`` says what is missing meanwhile.
    required: bool = True
    missing_means: str = ""
    process: subprocess.Popen[bytes] | None = None
    crashes: collections.deque[float] = field(default_factory=collections.deque)
    restart_at: float | None = None


# ----------------------------------------------------------------------------- pid files


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat); None once gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def alive(pid: int) -> bool:
    """True while the process runs; an exited one its parent has not reaped yet counts as gone."""
    return _start_time(pid) is not None


def pid_file(cfg: StackConfig, name: str) -> Path:
    return cfg.path("run", f"{name}.pid")


def write_pid_file(cfg: StackConfig, service: Service, timeout: float) -> None:
    assert service.process is not None
    pid = service.process.pid
    record = {
        "name": service.name,
        "pid": pid,
        "started": _start_time(pid),
        "signal": int(service.stop_signal),
        "group": service.stop_group,
        "timeout": service.stop_timeout or timeout,
    }
    path = pid_file(cfg, service.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def running_from_pid_files(cfg: StackConfig) -> list[dict[str, object]]:
    """Services a (possibly killed) supervisor left running, per their pid files."""
    found = []
    for path in sorted(cfg.path("run").glob("*.pid")):
        try:
            record = json.loads(path.read_text())
        except (ValueError, OSError):
            continue  # not ours (e.g. the supervisor's own stack.pid holds a bare number)
        if not isinstance(record, dict) or "pid" not in record:
            continue
        if _start_time(int(record["pid"])) == record.get("started"):
            found.append(record)
        else:
            path.unlink(missing_ok=True)  # stale: that process is gone (or the pid was reused)
    return found


# ----------------------------------------------------------------------------- output


def _report(message: str) -> None:
    """A note about the supervisor's own output, on stderr: stdout may be what failed."""
    with contextlib.suppress(OSError):
        sys.stderr.write(f"stack: {message}\n")
        sys.stderr.flush()


class _LogFile(logging.handlers.RotatingFileHandler):
    """A service's log file whose write errors (a full disk) are said once per run of failures.

    logging's own handler prints a traceback per lost line; either way the pump reads on.
    """

    failing = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)  # calls handleError() on failure, never raises
        if not self._failed:
            self.failing = False

    def handleError(self, record: logging.LogRecord) -> None:
        self._failed = True
        if not self.failing:
            self.failing = True
            _report(
                f"cannot write {self.baseFilename} ({sys.exc_info()[1]}); its lines are lost until it can"
            )


# ----------------------------------------------------------------------------- stopping


def _signal(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _kill_leftovers(pid: int) -> None:
    """SIGKILL whatever is left in a service's process group (its main process has exited)."""
    _signal(pid, signal.SIGKILL, group=True)


def stop_pids(records: list[dict[str, object]], poll: Callable[[int], bool] = alive) -> None:
    """Signal each record's process (or group), wait up to its timeout, then SIGKILL its group."""
    for record in records:
        _signal(int(str(record["pid"])), int(str(record["signal"])), bool(record["group"]))
    start = time.monotonic()
    for record in records:
        pid = int(str(record["pid"]))
        deadline = start + float(str(record["timeout"]))
        while poll(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _kill_leftovers(pid)


class Supervisor:
    """Runs services in the foreground, tees their output to stdout and var/log/<name>.log."""

    def __init__(self, cfg: StackConfig, echo: bool = True) -> None:
        self.cfg = cfg
        self.echo = echo
        self.services: list[Service] = []
        self.stopping = threading.Event()
        # While True, Ctrl-C/SIGTERM raise StackInterrupted (see signals_stop).
        self.starting = False
        self.in_spawn = False
        self.max_crashes = MAX_CRASHES
        self.crash_window = CRASH_WINDOW_SECONDS
        self.backoff_base = BACKOFF_BASE_SECONDS
        self.hold_seconds = HOLD_SECONDS
        self._lock = threading.Lock()

    # Output -----------------------------------------------------------------
    def _logger(self, name: str) -> logging.Logger:
        logger = logging.getLogger(f"stack.{self.cfg.name}.{name}")
        # A fresh file handle per start: a restarted service must not keep
        # writing into a file that was rotated or removed meanwhile.
        for old in list(logger.handlers):
            logger.removeHandler(old)
            with contextlib.suppress(OSError):  # its last lines are lost to a full disk: the pump must start
                old.close()
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        handler = _LogFile(
            self.cfg.log_dir / f"{name}.log",
            maxBytes=env_int("TTS_LOG_MAX_BYTES", 10 * 1024 * 1024),
            backupCount=env_int("TTS_LOG_BACKUP_COUNT", 5),
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
        return logger

    def _pump(self, name: str, process: subprocess.Popen[bytes]) -> None:
        """Read the service's output to its end, whatever fails to take it: a pump that stopped
        reading would leave the service blocked on a full pipe."""
        assert process.stdout is not None
        logger = self._logger(name)
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            logger.info(line)
            if self.echo:
                self._write_stdout(f"{name:>12} | {line}\n")

    def _write_stdout(self, text: str) -> None:
        """Echo to stdout until a write fails (its reader gone, a full disk); then only var/log/ gets it."""
        with self._lock:
            if not self.echo:
                return
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except OSError as exc:
                self.echo = False
                _report(
                    f"cannot write to stdout ({exc}); the services' output goes on to {self.cfg.log_dir} only"
                )

    def say(self, message: str) -> None:
        with self._lock:
            try:
                print(f"stack: {message}", flush=True)
            except OSError:
                _report(message)

    # Starting ---------------------------------------------------------------
    def _spawn(self, service: Service) -> None:
        if service.before_start is not None:
            service.before_start()
        # An interruption must not land between the fork and our note of the
        # child, or the child would run on unseen: the handler only raises
        # outside this section (see signals_stop), and start() checks after it.
        self.in_spawn = True
        try:
            service.process = subprocess.Popen(  # type: ignore[call-overload]
                service.command,
                env={**os.environ, **service.env},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **service.popen_kwargs,
            )
            if service not in self.services:
                self.services.append(service)
        finally:
            self.in_spawn = False
        assert service.process is not None
        write_pid_file(self.cfg, service, 30)
        threading.Thread(target=self._pump, args=(service.name, service.process), daemon=True).start()

    def start(self, service: Service, timeout: float = 60) -> Service:
        self._check_interrupted()
        self._spawn(service)
        self._check_interrupted()
        self._wait_ready(service, timeout)
        return service

    def _check_interrupted(self) -> None:
        if self.stopping.is_set() and self.starting:
            self.starting = False
            raise StackInterrupted

    def _wait_ready(self, service: Service, timeout: float) -> None:
        if service.ready_port is None:
            return
        assert service.process is not None
        deadline = time.monotonic() + timeout
        while True:
            if service.process.poll() is not None:
                log = self.cfg.log_dir / f"{service.name}.log"
                raise StackError(f"{service.name} exited with status {service.process.returncode}; see {log}")
            try:
                wait_for_port(service.ready_port, 0.5)
                return
            except StackError:
                if time.monotonic() > deadline:
                    raise

    # Watching and restarting ------------------------------------------------
    def watch(self) -> int:
        """Restart services that die, with backoff; returns 0 when asked to stop, 1 on giving up."""
        while not self.stopping.is_set():
            for service in list(self.services):
                if not self._check(service):
                    return 1
            self.stopping.wait(0.2)
        return 0

    def _check(self, service: Service) -> bool:
        """Look after one service; False when it crashed too often to go on."""
        process = service.process
        if process is None or process.poll() is None:
            return True
        now = time.monotonic()
        if service.restart_at is None:
            service.crashes.append(now)
            while service.crashes and service.crashes[0] < now - self.crash_window:
                service.crashes.popleft()
            log = self.cfg.log_dir / f"{service.name}.log"
            crashed = (
                f"{service.name} exited {len(service.crashes)} times within "
                f"{self.crash_window:.0f} s (last status {process.returncode})"
            )
            if len(service.crashes) >= self.max_crashes and service.required:
                self.say(f"{crashed}; giving up. See {log}")
                return False
            if len(service.crashes) >= self.max_crashes:
                # The stack serves without it: try again after the hold, with a fresh count.
                service.crashes.clear()
                self.say(
                    f"{crashed}; holding it back for {self.hold_seconds:g} s (the rest keeps serving; "
                    f"meanwhile {service.missing_means or 'it does not run'}). See {log}"
                )
                service.restart_at = now + self.hold_seconds
            else:
                delay = min(BACKOFF_MAX_SECONDS, self.backoff_base * 2 ** (len(service.crashes) - 1))
                self.say(f"{service.name} exited with status {process.returncode}; restarting in {delay:g} s")
                service.restart_at = now + delay
            _kill_leftovers(process.pid)  # e.g. Nginx workers still holding the ports
        elif now >= service.restart_at:
            service.restart_at = None
            try:
                self._spawn(service)
            except OSError as exc:
                self.say(f"{service.name} could not be restarted: {exc}")
                service.process = process  # counts as another crash on the next look
                return True
            self.say(f"{service.name} restarted (pid {service.process.pid if service.process else '?'})")
        return True

    # Stopping ---------------------------------------------------------------
    def stop_all(self, timeout: float = 30) -> None:
        """Stop the application tier together, then the data services it needs, in reverse order.

        A Celery worker gets its own (longer) timeout: it is signalled through its
        parent only and running jobs finish within the stop grace period.
        """
        self.stopping.set()
        running = [s for s in reversed(self.services) if s.process is not None and s.process.poll() is None]
        app_tier = [s for s in running if s.name not in DATA_SERVICES]
        data_tier = [s for s in running if s.name in DATA_SERVICES]
        self._stop_together(app_tier, timeout)
        for service in data_tier:
            self._stop_together([service], timeout)

    def stop(self, service: Service, timeout: float = 30) -> None:
        """Stop one service as stop_all() would (the stop signal, its timeout, then SIGKILL)."""
        if service.process is not None and service.process.poll() is None:
            self._stop_together([service], timeout)

    def _stop_together(self, services: list[Service], timeout: float) -> None:
        records: list[dict[str, object]] = []
        for service in services:
            assert service.process is not None
            records.append(
                {
                    "pid": service.process.pid,
                    "signal": service.stop_signal,
                    "group": service.stop_group,
                    "timeout": service.stop_timeout or timeout,
                }
            )
        by_pid = {s.process.pid: s.process for s in services if s.process is not None}
        stop_pids(records, poll=lambda pid: by_pid[pid].poll() is None)
        for service in services:
            assert service.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.process.wait(5)
            pid_file(self.cfg, service.name).unlink(missing_ok=True)


@contextlib.contextmanager
def signals_stop(sup: Supervisor) -> Iterator[None]:
    """Ctrl-C and SIGTERM stop the stack: at once while starting, else after the watch loop wakes."""

    def handler(signum: int, _frame: object) -> None:
        sup.stopping.set()
        if sup.starting and not sup.in_spawn:
            sup.starting = False  # raise once; the clean-up that follows must run undisturbed
            raise StackInterrupted

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
