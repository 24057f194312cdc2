"""Provisioning for the local stack: its config, PostgreSQL and Redis set-up, certificates, command lines.

Everything lives under ``TTS_VAR_DIR`` (default ``var/``): data, sockets, logs,
secrets, certificates. Nothing touches a system-wide instance. The supervisor
that runs these commands is deploy/supervisor.py; ``make run`` is deploy/stack.py.
:func:`prepare_var` creates a stack's secrets and folders before anything starts
(reading a password or the settings creates nothing).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.privileges import (
    APP_SYSTEM_USER,
    PG_SYSTEM_USER,
    app_user,
    as_user,
    chown_tree,
    pg_user,
    process_user,
)
from webapp import provisioning
from webapp.env import (
    WORKER_ENGINES_DEFAULT,
    env_int,
    env_list,
    env_str,
    worker_queues,
    write_private,
)

ROOT = Path(__file__).resolve().parent.parent


class StackError(RuntimeError):
    """A one-line problem the user can act on."""


def _pg_bindir() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists():
            return candidate
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    raise StackError("PostgreSQL server binaries not found; run `make run` as root or install postgresql")


PORT_VARS = {
    "pg_port": "TTS_PG_PORT",
    "redis_port": "TTS_REDIS_PORT",
    "http_port": "TTS_HTTP_PORT",
    "https_port": "TTS_HTTPS_PORT",
}
TEST_PORT_VARS = {attr: name.replace("TTS_", "TTS_TEST_", 1) for attr, name in PORT_VARS.items()}


# The stack's own secrets (the app's two are in webapp/provisioning.py), with the variable that replaces each.
STACK_SECRETS = {"pg_password": "TTS_PG_PASSWORD", "redis_password": "TTS_REDIS_PASSWORD"}


@dataclass
class StackConfig:
    var_dir: Path
    pg_port: int
    redis_port: int
    http_port: int
    https_port: int
    name: str = "run"
    # Which setting changes each port, for the "port in use" message.
    port_vars: dict[str, str] = field(default_factory=lambda: dict(PORT_VARS))

    @classmethod
    def from_env(cls) -> StackConfig:
        return cls(
            var_dir=Path(env_str("TTS_VAR_DIR", str(ROOT / "var"))).resolve(),
            pg_port=env_int("TTS_PG_PORT", 15432),
            redis_port=env_int("TTS_REDIS_PORT", 16379),
            http_port=env_int("TTS_HTTP_PORT", 8080),
            https_port=env_int("TTS_HTTPS_PORT", 8443),
        )

    @classmethod
    def for_tests(cls) -> StackConfig:
        return cls(
            var_dir=Path(env_str("TTS_TEST_VAR_DIR", str(ROOT / "var" / "test"))).resolve(),
            pg_port=env_int("TTS_TEST_PG_PORT", 15433),
            redis_port=env_int("TTS_TEST_REDIS_PORT", 16380),
            http_port=env_int("TTS_TEST_HTTP_PORT", 18080),
            https_port=env_int("TTS_TEST_HTTPS_PORT", 18443),
            name="test",
            port_vars=dict(TEST_PORT_VARS),
        )

    # Paths -------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return self.var_dir.joinpath(*parts)

    @property
    def pg_data(self) -> Path:
        return self.path("pg", "data")

    @property
    def gunicorn_socket(self) -> Path:
        return self.path("run", "gunicorn.sock")

    @property
    def log_dir(self) -> Path:
        return self.path("log")

    def secret(self, name: str) -> str:
        """A generated secret kept under var/secrets; read only (:func:`prepare_var` creates it)."""
        path = self.path("secrets", name)
        value = provisioning.read_secret(path)
        if not value:
            raise StackError(
                f"{path} is missing: the stack's provisioning creates it (`make run`, or "
                f"deploy.provision.prepare_var), or set {STACK_SECRETS[name]}"
            )
        return value

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
            # E-mail (sign-up and password links) lands in files a person can open.
            "DJANGO_EMAIL_BACKEND": os.environ.get(
                "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend"
            ),
            "TTS_MAIL_DIR": os.environ.get("TTS_MAIL_DIR", str(self.path("mail"))),
            "DJANGO_CSRF_TRUSTED_ORIGINS": os.environ.get(
                "DJANGO_CSRF_TRUSTED_ORIGINS",
                f"https://localhost:{self.https_port},https://127.0.0.1:{self.https_port}",
            ),
            # Links in e-mails start with it (never with the request's Host).
            "TTS_PUBLIC_ORIGIN": os.environ.get("TTS_PUBLIC_ORIGIN", f"https://localhost:{self.https_port}"),
        }


# ----------------------------------------------------------------------------- ports and users


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


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files created meanwhile (by us or a child such as openssl) are 0600/0700."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


# ----------------------------------------------------------------------------- PostgreSQL


def pg_initialised(cfg: StackConfig) -> bool:
    return (cfg.pg_data / "PG_VERSION").exists()


def _initdb(cfg: StackConfig, user: pwd.struct_passwd | None) -> None:
    pwfile = cfg.path("pg", "pwfile")
    write_private(pwfile, cfg.pg_password + "\n")
    if user is not None:
        os.chown(pwfile, user.pw_uid, user.pw_gid)
    try:
        subprocess.run(
            [str(_pg_bindir() / "initdb"), "-D", str(cfg.pg_data), "-U", "tts", "--pwfile", str(pwfile)]
            + ["--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
            check=True,
            stdout=subprocess.DEVNULL,
            **as_user(user),
        )
    finally:
        pwfile.unlink(missing_ok=True)


def init_postgres(cfg: StackConfig) -> None:
    if pg_initialised(cfg):
        return
    user = pg_user()
    cfg.pg_data.mkdir(parents=True, exist_ok=True)
    socket_dir = cfg.path("pg", "socket")
    socket_dir.mkdir(parents=True, exist_ok=True)
    chown_tree(cfg.path("pg"), user)
    _ensure_traversable(cfg.path("pg"))
    _initdb(cfg, user)
    listen = os.environ.get("TTS_PG_LISTEN", "127.0.0.1")
    conf = (
        f"port = {cfg.pg_port}\n"
        f"listen_addresses = '{listen}'\n"
        f"unix_socket_directories = '{socket_dir}'\n"
        "max_connections = 200\n"
        "shared_buffers = 128MB\n"
        "logging_collector = off\n"
    )
    if cfg.name == "test":
        # Test data is disposable; durability costs seconds per test run.
        conf += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
    with (cfg.pg_data / "postgresql.auto.conf").open("a") as fh:
        fh.write(conf)
    # Other hosts (worker nodes) authenticate with the password; tests add their ranges.
    extra = os.environ.get("TTS_PG_ALLOW_CIDRS", "")
    if extra:
        with (cfg.pg_data / "pg_hba.conf").open("a") as fh:
            for cidr in extra.split(","):
                fh.write(f"host all all {cidr.strip()} scram-sha-256\n")


def postgres_command(cfg: StackConfig) -> tuple[list[str], dict[str, Any]]:
    # The port on the command line, not only in the cluster's config: a changed
    # TTS_PG_PORT takes effect on the next start of an existing cluster.
    command = [str(_pg_bindir() / "postgres"), "-D", str(cfg.pg_data), "-p", str(cfg.pg_port)]
    return command, as_user(pg_user())


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
    write_private(
        conf,
        f"port {cfg.redis_port}\n"
        f"bind {bind}\n"
        "protected-mode yes\n"
        f'requirepass "{cfg.redis_password}"\n'
        f"dir {data}\n"
        # Queued jobs survive a Redis restart or crash (at most the last second is lost;
        # the redispatch job re-sends what PostgreSQL says is queued).
        "appendonly yes\n"
        "appendfsync everysec\n"
        'save ""\n'
        "daemonize no\n"
        "loglevel notice\n"
        'logfile ""\n',
    )
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
    subject = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:127.0.0.2"]
    with private_umask():  # the key is never readable by others, not even while written
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "825", *subject]
            + ["-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
        )
    cert.chmod(0o644)
    return cert, key


# ----------------------------------------------------------------------------- Django processes


def venv_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def gunicorn_command(
    cfg: StackConfig, workers: int | None = None, drop_privileges: bool = False
) -> list[str]:
    """gunicorn with deploy/gunicorn.conf.py, as tts-web.service runs it; only the socket is ours."""
    command = [
        venv_bin("gunicorn"),
        "--config",
        str(ROOT / "deploy" / "gunicorn.conf.py"),
        "--bind",
        f"unix:{cfg.gunicorn_socket}",
        # Not in $HOME, where two stacks on one machine would fight over it.
        "--control-socket",
        str(cfg.path("run", "gunicorn.ctl")),
        "--chdir",
        str(ROOT),
    ]
    user = app_user()
    if user is not None:
        # Nginx's workers run as nobody in the app user's group: the socket (0660) is shared through it.
        command += ["--group", APP_SYSTEM_USER]
        if drop_privileges and process_user() is not None:  # the master binds the socket as root
            command += ["--user", APP_SYSTEM_USER]
    if workers is not None:
        command += ["--workers", str(workers)]
    return command  # the application (webapp.asgi) is named in gunicorn.conf.py


def worker_command(
    cfg: StackConfig, queues: str | None = None, concurrency: str | None = None, name: str = "synth"
) -> list[str]:
    """A Celery worker; without ``concurrency`` it takes CELERY_WORKER_CONCURRENCY from settings."""
    engines = env_list("TTS_WORKER_ENGINES", WORKER_ENGINES_DEFAULT)
    queue_list = queues or ",".join(worker_queues("synth", engines))
    command = [venv_bin("celery"), "-A", "webapp", "worker", "--loglevel", "INFO", "--pool", "prefork"]
    if concurrency is not None:
        command += ["--concurrency", concurrency]
    return [*command, "-Q", queue_list, "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]


def housekeeping_worker_command(cfg: StackConfig) -> list[str]:
    """Run with TTS_WORKER_ROLE=housekeeping, which sets its queues' concurrency in settings."""
    return worker_command(cfg, queues=",".join(worker_queues("housekeeping", [])), name="housekeeping")


def beat_command(cfg: StackConfig) -> list[str]:
    schedule = str(cfg.path("cache", "celerybeat-schedule"))  # beat runs as the app user: its folder
    # No pid file: after a crash a stale one would keep the restarted beat from starting.
    command = [venv_bin("celery"), "-A", "webapp", "beat", "--loglevel", "INFO", "--schedule", schedule]
    return [*command, "--pidfile", ""]


def django_env_for(cfg: StackConfig, process: str) -> dict[str, str]:
    # The supervisor writes var/log/<process>.log; Django must not write it twice.
    return {**cfg.django_env(), "TTS_PROCESS_NAME": process, "TTS_LOG_TO_FILE": "0", "PYTHONUNBUFFERED": "1"}


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


def app_layout(cfg: StackConfig) -> provisioning.VarLayout:
    """The folders and secret files the settings see under this stack's environment."""
    return provisioning.VarLayout.from_env({**os.environ, **cfg.django_env()})


def prepare_var(cfg: StackConfig) -> list[Path]:
    """Create what the stack's processes need before any starts; returns what was created.

    First the PostgreSQL and Redis passwords (their variables replace them), which the
    Django processes' environment names; then, as ``manage.py prepare_var`` does, the
    app's folders and secrets as that environment lays them out. Existing ones are kept,
    so every start runs it (`make run`, the test stack, a restore after its secrets).
    """
    created = [
        cfg.path("secrets", name)
        for name, variable in STACK_SECRETS.items()
        if not os.environ.get(variable) and provisioning.create_secret(cfg.path("secrets", name))
    ]
    return created + provisioning.prepare_var(app_layout(cfg))


def prepare_django(cfg: StackConfig, seed: bool) -> None:
    """Migrate, collect static files and seed the demo (after :func:`prepare_var`)."""
    manage(cfg, "migrate", "--noinput", "-v", "0")
    manage(cfg, "collectstatic", "--noinput", "-v", "0")
    if seed:
        manage(cfg, "bootstrap_demo", f"--https-port={cfg.https_port}")
