"""The local stack: project-owned PostgreSQL, Redis, Nginx, gunicorn and Celery under one supervisor.

Used by ``make run`` (``python -m deploy.stack run``) and by the test suite
(``tests/stack.py`` starts the same services on other ports under var/test/).
Standard library only, so it can run before the project is installed.

Everything lives under ``TTS_VAR_DIR`` (default ``var/``): data, sockets,
logs, secrets, certificates. Nothing touches a system-wide instance.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG_SYSTEM_USER = "tts-pg"
DATA_SERVICES = ("postgres", "redis")


class StackError(RuntimeError):
    """A one-line problem the user can act on."""


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if not raw else int(raw)


def _pg_bindir() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists():
            return candidate
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    raise StackError("PostgreSQL server binaries not found; run `make run` as root or install postgresql")


@dataclass
class StackConfig:
    var_dir: Path
    pg_port: int
    redis_port: int
    http_port: int
    https_port: int
    name: str = "run"
    # Which setting changes each port, for the "port in use" message.
    port_vars: dict[str, str] = field(
        default_factory=lambda: {
            "pg_port": "TTS_PG_PORT",
            "redis_port": "TTS_REDIS_PORT",
            "http_port": "TTS_HTTP_PORT",
            "https_port": "TTS_HTTPS_PORT",
        }
    )

    @classmethod
    def from_env(cls) -> StackConfig:
        return cls(
            var_dir=Path(os.environ.get("TTS_VAR_DIR", str(ROOT / "var"))).resolve(),
            pg_port=_env_int("TTS_PG_PORT", 55432),
            redis_port=_env_int("TTS_REDIS_PORT", 56379),
            http_port=_env_int("TTS_HTTP_PORT", 8080),
            https_port=_env_int("TTS_HTTPS_PORT", 8443),
        )

    @classmethod
    def for_tests(cls) -> StackConfig:
        return cls(
            var_dir=Path(os.environ.get("TTS_TEST_VAR_DIR", str(ROOT / "var" / "test"))).resolve(),
            pg_port=_env_int("TTS_TEST_PG_PORT", 55433),
            redis_port=_env_int("TTS_TEST_REDIS_PORT", 56380),
            http_port=_env_int("TTS_TEST_HTTP_PORT", 18080),
            https_port=_env_int("TTS_TEST_HTTPS_PORT", 18443),
            name="test",
            port_vars={
                "pg_port": "TTS_TEST_PG_PORT",
                "redis_port": "TTS_TEST_REDIS_PORT",
                "http_port": "TTS_TEST_HTTP_PORT",
                "https_port": "TTS_TEST_HTTPS_PORT",
            },
        )

    # Paths -------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return self.var_dir.joinpath(*parts)

    @property
    def pg_data(self) -> Path:
        return self.path("pg", "data")

    @property
    def run_dir(self) -> Path:
        return self.path("run")

    @property
    def gunicorn_socket(self) -> Path:
        return self.path("run", "gunicorn.sock")

    @property
    def log_dir(self) -> Path:
        return self.path("log")

    def secret(self, name: str) -> str:
        """A generated secret kept under var/secrets (created once, mode 0600)."""
        path = self.path("secrets", name)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.parent.chmod(0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(24))
        return path.read_text().strip()

    @property
    def pg_password(self) -> str:
        return os.environ.get("TTS_PG_PASSWORD") or self.secret("pg_password")

    @property
    def redis_password(self) -> str:
        return os.environ.get("TTS_REDIS_PASSWORD") or self.secret("redis_password")

    @property
    def database_url(self) -> str:
        return f"postgres://tts:{self.pg_password}@127.0.0.1:{self.pg_port}/tts"

    @property
    def redis_url(self) -> str:
        return f"redis://:{self.redis_password}@127.0.0.1:{self.redis_port}/0"

    def django_env(self) -> dict[str, str]:
        """Environment for every Django/Celery process of this stack."""
        return {
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
            "TTS_VAR_DIR": str(self.var_dir),
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "TTS_MEDIA_ROOT": str(self.path("media")),
            "TTS_STATIC_ROOT": str(self.path("static")),
            "TTS_LOG_DIR": str(self.log_dir),
            "TTS_VOICES_DIR": os.environ.get("TTS_VOICES_DIR", str(self.path("voices"))),
            "DJANGO_CSRF_TRUSTED_ORIGINS": os.environ.get(
                "DJANGO_CSRF_TRUSTED_ORIGINS",
                f"https://localhost:{self.https_port},https://127.0.0.1:{self.https_port}",
            ),
        }


# ----------------------------------------------------------------------------- helpers

log = logging.getLogger("stack")


def is_root() -> bool:
    return os.geteuid() == 0


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def check_ports(cfg: StackConfig, which: list[str]) -> None:
    for attr in which:
        port = getattr(cfg, attr)
        if port_in_use(port):
            raise StackError(f"port {port} is already in use; set {cfg.port_vars[attr]} to use another port")


def wait_for_port(port: int, timeout: float, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    raise StackError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


def _pg_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: then it runs as an unprivileged system user."""
    if not is_root():
        return None
    try:
        return pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER],
            check=True,
        )
        return pwd.getpwnam(PG_SYSTEM_USER)


def _chown_tree(path: Path, user: pwd.struct_passwd | None) -> None:
    if user is None:
        return
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, user.pw_uid, user.pw_gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), user.pw_uid, user.pw_gid)


def _as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _ensure_traversable(path: Path) -> None:
    """Let the unprivileged PostgreSQL user reach its data directory under var/."""
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            # Search permission only (not read): PostgreSQL's user must reach var/pg.
            print(f"stack: allowing {PG_SYSTEM_USER} to traverse {parent} (chmod o+x)", flush=True)
            parent.chmod(mode | 0o001)


# ----------------------------------------------------------------------------- PostgreSQL


def pg_initialised(cfg: StackConfig) -> bool:
    return (cfg.pg_data / "PG_VERSION").exists()


def init_postgres(cfg: StackConfig) -> None:
    if pg_initialised(cfg):
        return
    bindir = _pg_bindir()
    user = _pg_user()
    cfg.pg_data.mkdir(parents=True, exist_ok=True)
    socket_dir = cfg.path("pg", "socket")
    socket_dir.mkdir(parents=True, exist_ok=True)
    _chown_tree(cfg.path("pg"), user)
    _ensure_traversable(cfg.path("pg"))
    pwfile = cfg.path("pg", "pwfile")
    pwfile.write_text(cfg.pg_password + "\n")
    if user is not None:
        os.chown(pwfile, user.pw_uid, user.pw_gid)
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(cfg.pg_data),
            "-U",
            "tts",
            "--pwfile",
            str(pwfile),
            "--auth-local=scram-sha-256",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        **_as_user(user),
    )
    pwfile.unlink()
    listen = os.environ.get("TTS_PG_LISTEN", "127.0.0.1")
    with (cfg.pg_data / "postgresql.auto.conf").open("a") as fh:
        fh.write(
            f"port = {cfg.pg_port}\n"
            f"listen_addresses = '{listen}'\n"
            f"unix_socket_directories = '{socket_dir}'\n"
            "max_connections = 200\n"
            "shared_buffers = 128MB\n"
            "logging_collector = off\n"
        )
    if cfg.name == "test":
        # Test data is disposable; durability costs seconds per test run.
        with (cfg.pg_data / "postgresql.auto.conf").open("a") as fh:
            fh.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
    # Other hosts (worker nodes) authenticate with the password; tests add their ranges.
    extra = os.environ.get("TTS_PG_ALLOW_CIDRS", "")
    if extra:
        with (cfg.pg_data / "pg_hba.conf").open("a") as fh:
            for cidr in extra.split(","):
                fh.write(f"host all all {cidr.strip()} scram-sha-256\n")


def postgres_command(cfg: StackConfig) -> tuple[list[str], dict[str, Any]]:
    return [str(_pg_bindir() / "postgres"), "-D", str(cfg.pg_data)], _as_user(_pg_user())


def pg_ctl(cfg: StackConfig, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(_pg_bindir() / "pg_ctl"), "-D", str(cfg.pg_data), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **_as_user(_pg_user()),
    )


def create_database(cfg: StackConfig) -> None:
    """Create the ``tts`` database if missing (initdb made the role)."""
    env = {**os.environ, "PGPASSWORD": cfg.pg_password}
    base = ["psql", "-h", "127.0.0.1", "-p", str(cfg.pg_port), "-U", "tts", "-d", "postgres", "-tAc"]
    out = subprocess.run(
        [*base, "SELECT 1 FROM pg_database WHERE datname='tts'"], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise StackError(f"cannot reach PostgreSQL on port {cfg.pg_port}: {out.stderr.strip()}")
    if out.stdout.strip() != "1":
        subprocess.run([*base, "CREATE DATABASE tts"], env=env, check=True, capture_output=True)


# ----------------------------------------------------------------------------- Redis


def write_redis_conf(cfg: StackConfig) -> Path:
    data = cfg.path("redis")
    data.mkdir(parents=True, exist_ok=True)
    conf = cfg.path("redis", "redis.conf")
    bind = os.environ.get("TTS_REDIS_BIND", "127.0.0.1")
    conf.write_text(
        f"port {cfg.redis_port}\n"
        f"bind {bind}\n"
        "protected-mode yes\n"
        f'requirepass "{cfg.redis_password}"\n'
        f"dir {data}\n"
        # Queued jobs survive a Redis restart.
        "appendonly yes\n"
        "appendfsync everysec\n"
        'save ""\n'
        "daemonize no\n"
        "loglevel notice\n"
        'logfile ""\n'
    )
    conf.chmod(0o600)
    return conf


def redis_command(cfg: StackConfig) -> list[str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    return [binary, str(write_redis_conf(cfg))]


# ----------------------------------------------------------------------------- TLS and Nginx


def ensure_certificate(cfg: StackConfig) -> tuple[Path, Path]:
    cert = Path(os.environ.get("TTS_TLS_CERT", str(cfg.path("tls", "cert.pem"))))
    key = Path(os.environ.get("TTS_TLS_KEY", str(cfg.path("tls", "key.pem"))))
    if cert.exists() and key.exists():
        return cert, key
    cert.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "825",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:127.0.0.2",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return cert, key


def nginx_command(cfg: StackConfig) -> list[str]:
    from deploy.nginx import render_nginx_conf

    conf = render_nginx_conf(cfg)
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    return [binary, "-c", str(conf), "-p", str(cfg.path("nginx")), "-g", "daemon off;"]


# ----------------------------------------------------------------------------- Django processes


def venv_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def gunicorn_command(cfg: StackConfig) -> list[str]:
    return [
        venv_bin("gunicorn"),
        "webapp.wsgi:application",
        "--worker-class",
        "gthread",
        "--workers",
        os.environ.get("TTS_GUNICORN_WORKERS", "2"),
        "--threads",
        os.environ.get("TTS_GUNICORN_THREADS", "16"),
        "--bind",
        f"unix:{cfg.gunicorn_socket}",
        # Not in $HOME, where two stacks on one machine would fight over it.
        "--control-socket",
        str(cfg.path("run", "gunicorn.ctl")),
        "--umask",
        "0o000",
        # Longer than the synchronous OpenAI endpoint waits.
        "--timeout",
        os.environ.get("TTS_GUNICORN_TIMEOUT", "180"),
        "--graceful-timeout",
        "20",
        "--access-logfile",
        "-",
        "--chdir",
        str(ROOT),
    ]


def worker_command(
    cfg: StackConfig, queues: str | None = None, concurrency: str | None = None, name: str = "synth"
) -> list[str]:
    engines = os.environ.get("TTS_WORKER_ENGINES", "piper,espeak").split(",")
    queue_list = queues or ",".join(f"synth.{e.strip()}" for e in engines if e.strip())
    return [
        venv_bin("celery"),
        "-A",
        "webapp",
        "worker",
        "--loglevel",
        "INFO",
        "--pool",
        "prefork",
        # Default 2 single-threaded children: faster than 1 child x 2 threads on 2 cores
        # (docs/performance.md, "workers"); keep in step with settings.TTS_WORKER_CONCURRENCY.
        "--concurrency",
        concurrency or os.environ.get("TTS_WORKER_CONCURRENCY", "2"),
        "-Q",
        queue_list,
        "-n",
        f"{name}@%h",
        "--without-mingle",
        "--without-gossip",
    ]


def housekeeping_worker_command(cfg: StackConfig) -> list[str]:
    # Two children: a long orphan sweep must not hold up the 30-second lease reaper.
    return worker_command(cfg, queues="default,housekeeping", concurrency="2", name="housekeeping")


def beat_command(cfg: StackConfig) -> list[str]:
    return [
        venv_bin("celery"),
        "-A",
        "webapp",
        "beat",
        "--loglevel",
        "INFO",
        "--schedule",
        str(cfg.path("run", "celerybeat-schedule")),
        "--pidfile",
        "",
    ]


def manage(cfg: StackConfig, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cfg.django_env(), "TTS_LOG_TO_FILE": "0"}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        check=True,
        text=True,
        capture_output=capture,
        cwd=ROOT,
    )


# ----------------------------------------------------------------------------- supervisor


@dataclass
class Service:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    popen_kwargs: dict[str, object] = field(default_factory=dict)
    ready_port: int | None = None
    stop_signal: int = signal.SIGTERM
    process: subprocess.Popen[bytes] | None = None


class Supervisor:
    """Runs services in the foreground, tees their output to stdout and var/log/<name>.log."""

    def __init__(self, cfg: StackConfig, echo: bool = True) -> None:
        self.cfg = cfg
        self.echo = echo
        self.services: list[Service] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def _logger(self, name: str) -> logging.Logger:
        logger = logging.getLogger(f"stack.{self.cfg.name}.{name}")
        # A fresh file handle per start: a restarted service must not keep
        # writing into a file that was rotated or removed meanwhile.
        for old in list(logger.handlers):
            logger.removeHandler(old)
            old.close()
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            self.cfg.log_dir / f"{name}.log",
            maxBytes=_env_int("TTS_LOG_MAX_BYTES", 10 * 1024 * 1024),
            backupCount=_env_int("TTS_LOG_BACKUP_COUNT", 5),
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
        return logger

    def _pump(self, service: Service) -> None:
        assert service.process is not None and service.process.stdout is not None
        logger = self._logger(service.name)
        for raw in service.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            logger.info(line)
            if self.echo:
                with self._lock:
                    sys.stdout.write(f"{service.name:>12} | {line}\n")
                    sys.stdout.flush()

    def start(self, service: Service, timeout: float = 60) -> Service:
        env = {**os.environ, **service.env}
        service.process = subprocess.Popen(  # type: ignore[call-overload]
            service.command,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **service.popen_kwargs,
        )
        self.services.append(service)
        threading.Thread(target=self._pump, args=(service,), daemon=True).start()
        if service.ready_port is not None:
            deadline = time.monotonic() + timeout
            while True:
                if service.process.poll() is not None:
                    raise StackError(
                        f"{service.name} exited with status {service.process.returncode}; see {self.cfg.log_dir / (service.name + '.log')}"
                    )
                try:
                    wait_for_port(service.ready_port, 0.5)
                    break
                except StackError:
                    if time.monotonic() > deadline:
                        raise
        return service

    def stop_all(self, timeout: float = 30) -> None:
        """Stop the application tier together, then the data services it needs, in reverse order.

        Celery's warm shutdown lets a running job finish (acks_late returns it to
        the queue if we have to kill it), so the app tier gets ``timeout`` seconds.
        """
        self.stopping.set()
        running = [s for s in reversed(self.services) if s.process is not None and s.process.poll() is None]
        app_tier = [s for s in running if s.name not in DATA_SERVICES]
        data_tier = [s for s in running if s.name in DATA_SERVICES]
        self._stop_together(app_tier, timeout)
        for service in data_tier:
            self._stop_together([service], timeout)

    @staticmethod
    def _stop_together(services: list[Service], timeout: float) -> None:
        for service in services:
            assert service.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, service.stop_signal)
        deadline = time.monotonic() + timeout
        for service in services:
            assert service.process is not None
            try:
                service.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(service.process.pid, signal.SIGKILL)
                service.process.wait(5)

    def watch(self) -> int:
        """Block until a service dies or we are asked to stop. Returns an exit status."""
        while not self.stopping.is_set():
            for service in self.services:
                if service.process is not None and service.process.poll() is not None:
                    print(
                        f"stack: {service.name} exited with status {service.process.returncode}; stopping",
                        flush=True,
                    )
                    return 1
            self.stopping.wait(0.5)
        return 0


def start_data_services(sup: Supervisor, cfg: StackConfig) -> None:
    """PostgreSQL and Redis, initialised on first use and reused afterwards."""
    init_postgres(cfg)
    cmd, kwargs = postgres_command(cfg)
    # SIGINT is PostgreSQL's "fast" shutdown: roll back and exit cleanly.
    sup.start(
        Service("postgres", cmd, popen_kwargs=kwargs, ready_port=cfg.pg_port, stop_signal=signal.SIGINT)
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            create_database(cfg)
            break
        except StackError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    sup.start(Service("redis", redis_command(cfg), ready_port=cfg.redis_port))


def django_env_for(cfg: StackConfig, process: str) -> dict[str, str]:
    # The supervisor writes var/log/<process>.log; Django must not write it twice.
    return {**cfg.django_env(), "TTS_PROCESS_NAME": process, "TTS_LOG_TO_FILE": "0", "PYTHONUNBUFFERED": "1"}


def prepare_django(cfg: StackConfig, seed: bool) -> None:
    for folder in ("media", "static", "run", "voices", "tmp"):
        cfg.path(folder).mkdir(parents=True, exist_ok=True)
    manage(cfg, "migrate", "--noinput", "-v", "0")
    manage(cfg, "collectstatic", "--noinput", "-v", "0")
    if seed:
        manage(cfg, "bootstrap_demo", f"--https-port={cfg.https_port}")


@contextlib.contextmanager
def signals_stop(sup: Supervisor) -> Iterator[None]:
    def handler(signum: int, _frame: object) -> None:
        sup.stopping.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def cmd_run(cfg: StackConfig) -> int:
    check_ports(cfg, ["pg_port", "redis_port", "http_port", "https_port"])
    pidfile = cfg.path("run", "stack.pid")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(str(os.getpid()))
    sup = Supervisor(cfg)
    status = 1
    with signals_stop(sup):
        try:
            start_data_services(sup, cfg)
            prepare_django(cfg, seed=True)
            ensure_certificate(cfg)
            if cfg.gunicorn_socket.exists():
                cfg.gunicorn_socket.unlink()
            sup.start(Service("gunicorn", gunicorn_command(cfg), env=django_env_for(cfg, "gunicorn")))
            sup.start(Service("worker", worker_command(cfg), env=django_env_for(cfg, "worker")))
            sup.start(
                Service(
                    "housekeeping",
                    housekeeping_worker_command(cfg),
                    env={**django_env_for(cfg, "housekeeping"), "TTS_WORKER_ROLE": "housekeeping"},
                )
            )
            sup.start(Service("beat", beat_command(cfg), env=django_env_for(cfg, "beat")))
            sup.start(Service("nginx", nginx_command(cfg), ready_port=cfg.https_port))
            print(
                f"\n  The service is up: https://localhost:{cfg.https_port}  (Ctrl-C stops everything)\n",
                flush=True,
            )
            status = sup.watch()
        except StackError as exc:
            print(f"stack: {exc}", file=sys.stderr, flush=True)
        except subprocess.CalledProcessError as exc:
            print(
                f"stack: {' '.join(map(str, exc.cmd[:3]))} failed with status {exc.returncode}",
                file=sys.stderr,
            )
        except Exception as exc:  # one line for the user; details are in var/log/
            print(f"stack: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            print("stack: stopping...", flush=True)
            sup.stop_all()
            with contextlib.suppress(FileNotFoundError):
                pidfile.unlink()
            print("stack: stopped", flush=True)
    return status if not sup.stopping.is_set() or status else 0


def _alive(pid: int) -> bool:
    """True while the process runs; an exited one its parent has not reaped yet counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmd_stop(cfg: StackConfig) -> int:
    pidfile = cfg.path("run", "stack.pid")
    if not pidfile.exists():
        print("stack: not running")
        return 0
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink()
        print("stack: not running (stale pid file removed)")
        return 0
    # The app tier gets 30 s to finish running jobs, each data service 30 s more.
    for _ in range(1000):
        if not _alive(pid):
            print("stack: stopped")
            return 0
        time.sleep(0.1)
    print("stack: still stopping after 100 s", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack")
    parser.add_argument("command", choices=["run", "stop", "check-ports"])
    args = parser.parse_args(argv)
    cfg = StackConfig.from_env()
    try:
        if args.command == "run":
            return cmd_run(cfg)
        if args.command == "stop":
            return cmd_stop(cfg)
        check_ports(cfg, ["pg_port", "redis_port", "http_port", "https_port"])
        return 0
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
