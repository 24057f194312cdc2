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
    PG_SYSTEM_USER,
    as_user,
    chown_tree,
    pg_user,
)
from webapp import provisioning
from webapp.env import env_int, env_str, write_private

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
STACK_SECRETS = {
    "pg_password": "TTS_PG_PASSWORD",
    "pg_admin_password": "TTS_PG_ADMIN_PASSWORD",
    "redis_password": "TTS_REDIS_PASSWORD",
}

# The cluster's superuser, which only provisioning logs in as (its password stays root's), and the
# app's role, which owns the app's database and nothing else: no superuser, no CREATEDB or CREATEROLE.
PG_ADMIN_ROLE = "postgres"
PG_APP_ROLE = "tts"
PG_APP_DATABASE = "tts"
# A superuser that exists only while an older cluster's superuser `tts` is handed over (hand_over_superuser).
PG_HANDOVER_ROLE = "tts_handover"


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
    def pg_admin_password(self) -> str:
        return os.environ.get("TTS_PG_ADMIN_PASSWORD") or self.secret("pg_admin_password")

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
    write_private(pwfile, cfg.pg_admin_password + "\n")
    if user is not None:
        os.chown(pwfile, user.pw_uid, user.pw_gid)
    try:
        subprocess.run(
            [
                str(_pg_bindir() / "initdb"),
                "-D",
                str(cfg.pg_data),
                "-U",
                PG_ADMIN_ROLE,
                "--pwfile",
                str(pwfile),
            ]
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


def psql(
    cfg: StackConfig, role: str, password: str, sql: str, database: str = "postgres", **variables: str
) -> subprocess.CompletedProcess[str]:
    """Run ``sql`` (a psql script: ``:'name'`` quotes a variable) as ``role``; stops at the first error."""
    command = ["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(cfg.pg_port)]
    command += ["-U", role, "-d", database, "-f", "-"]
    for name, value in variables.items():
        command += ["-v", f"{name}={value}"]
    env = {**os.environ, "PGPASSWORD": password}
    return subprocess.run(command, input=sql, env=env, capture_output=True, text=True, check=False)


def _admin_can_log_in(cfg: StackConfig) -> bool:
    tried = psql(cfg, PG_ADMIN_ROLE, cfg.pg_admin_password, "SELECT 1")
    if tried.returncode == 0:
        return True
    if "password authentication failed" in tried.stderr or "does not exist" in tried.stderr:
        return False
    raise StackError(f"cannot reach PostgreSQL on port {cfg.pg_port}: {tried.stderr.strip()}")


def _checked(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        raise StackError(f"PostgreSQL: {what} failed: {done.stderr.strip()}")
    return done.stdout.strip()


# Everything the old superuser owns in the app's database becomes the app role's. REASSIGN OWNED
# cannot be used: the bootstrap superuser also owns the system catalogs. Sequences that belong to a
# column move with their table.
_HAND_OVER_OBJECTS = """
ALTER ROLE tts RENAME TO postgres;
ALTER ROLE postgres PASSWORD :'admin_password';
CREATE ROLE tts LOGIN PASSWORD :'app_password';
ALTER DATABASE tts OWNER TO tts;
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
  LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO tts', r.rel);
  END LOOP;
  FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind = 'S' AND c.relowner <> 'tts'::regrole
  LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO tts', r.rel);
  END LOOP;
END $$;
"""


def hand_over_superuser(cfg: StackConfig) -> None:
    """A cluster made before the app had its own role: its superuser is ``tts`` itself.

    The bootstrap superuser cannot lose its rights safely (it owns the system catalogs), so it is
    renamed ``postgres`` and given the admin password, and a new, plain ``tts`` with the app's
    password takes over the app's database and everything in it, in one transaction; a temporary
    superuser does the renaming (a session cannot rename its own role). Safe to run again after a crash.
    """
    bootstrap = _checked(
        psql(cfg, PG_APP_ROLE, cfg.pg_password, "SELECT rolname FROM pg_roles WHERE oid = 10"),
        f"logging in as {PG_ADMIN_ROLE} (var/secrets/pg_admin_password) and as {PG_APP_ROLE}",
    )
    if bootstrap != PG_APP_ROLE:
        raise StackError(
            f"cannot log in to PostgreSQL as {PG_ADMIN_ROLE}: the cluster's superuser is {bootstrap!r}; "
            "set TTS_PG_ADMIN_PASSWORD to its password"
        )
    print(f"stack: handing the database over from superuser {PG_APP_ROLE} to a plain role", flush=True)
    _checked(
        psql(
            cfg,
            PG_APP_ROLE,
            cfg.pg_password,
            f"DROP ROLE IF EXISTS {PG_HANDOVER_ROLE};\n"
            f"CREATE ROLE {PG_HANDOVER_ROLE} SUPERUSER LOGIN PASSWORD :'admin_password';",
            admin_password=cfg.pg_admin_password,
        ),
        "creating the hand-over role",
    )
    _checked(
        psql(
            cfg,
            PG_HANDOVER_ROLE,
            cfg.pg_admin_password,
            "BEGIN;\n" + _HAND_OVER_OBJECTS + "COMMIT;\n",
            database=PG_APP_DATABASE,
            admin_password=cfg.pg_admin_password,
            app_password=cfg.pg_password,
        ),
        "handing the database over",
    )


_APP_ROLE_AND_DATABASE = """
DROP ROLE IF EXISTS tts_handover;
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tts') AS role_missing \\gset
\\if :role_missing
CREATE ROLE tts LOGIN;
\\endif
ALTER ROLE tts LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'app_password';
SELECT NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'tts') AS database_missing \\gset
\\if :database_missing
CREATE DATABASE tts OWNER tts;
\\endif
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
"""


def create_database(cfg: StackConfig) -> None:
    """The app's role and database, as the cluster's superuser: ``tts`` owns database ``tts``, nothing else.

    The app's password is set on every start, so a changed TTS_PG_PASSWORD takes effect.
    """
    if not _admin_can_log_in(cfg):
        hand_over_superuser(cfg)
    _checked(
        psql(cfg, PG_ADMIN_ROLE, cfg.pg_admin_password, _APP_ROLE_AND_DATABASE, app_password=cfg.pg_password),
        "creating the app's role and database",
    )


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


def django_env_for(cfg: StackConfig, process: str) -> dict[str, str]:
    # The supervisor writes var/log/<process>.log; Django must not write it twice.
    return {**cfg.django_env(), "TTS_PROCESS_NAME": process, "TTS_LOG_TO_FILE": "0", "PYTHONUNBUFFERED": "1"}


def manage(cfg: StackConfig, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cfg.django_env(), "TTS_LOG_TO_FILE": "0"}
    if args[:1] == ("migrate",):
        env["TTS_PROCESS_NAME"] = (
            "migrate"  # its limits are a migration's (webapp/env.py, STATEMENT_TIMEOUTS)
        )
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
