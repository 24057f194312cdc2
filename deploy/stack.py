"""The local stack: project-owned PostgreSQL, Redis, Nginx, gunicorn and Celery under one supervisor.

Used by ``make run`` (``python -m deploy.stack run``), ``make stop``
(``python -m deploy.stack stop``) and by the test suite (``tests/stack.py``
starts the same services on other ports under var/test/). The processes and
their commands come from the table of process roles (deploy/roles.py); this
module only places them (sockets, files, users). Provisioning is in
deploy/provision.py, the supervisor in deploy/supervisor.py; the names the
tests use are re-exported here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from deploy import roles
from deploy.nginx import nginx_command
from deploy.privileges import APP_SYSTEM_USER, app_user, as_app_user, process_user, secure_var_dir
from deploy.provision import (
    ROOT,
    StackConfig,
    StackError,
    check_ports,
    create_database,
    django_env_for,
    ensure_certificate,
    init_postgres,
    manage,
    port_in_use,
    postgres_command,
    prepare_django,
    prepare_var,
    redis_command,
    venv_bin,
)
from deploy.roles import WORKER_STOP_MARGIN_SECONDS
from deploy.supervisor import (
    DATA_SERVICES,
    Service,
    StackInterrupted,
    Supervisor,
    alive,
    running_from_pid_files,
    signals_stop,
    stop_pids,
)
from webapp.env import ALLOWED_HOSTS_DEFAULT, WORKER_ENGINES_DEFAULT, env_int, env_list, env_str

__all__ = [
    "ROOT",
    "Service",
    "StackConfig",
    "StackError",
    "Supervisor",
    "WORKER_STOP_MARGIN_SECONDS",
    "beat_command",
    "check_ports",
    "django_env_for",
    "ensure_certificate",
    "gunicorn_command",
    "manage",
    "port_in_use",
    "postgres_command",
    "prepare_var",
    "redis_command",
    "role_service",
    "start_data_services",
    "worker_command",
    "worker_service",
]

ALL_PORTS = ["pg_port", "redis_port", "http_port", "https_port"]


def worker_stop_timeout() -> float:
    """A warm-stopping worker's grace period and the time it needs after it (deploy/roles.py)."""
    return roles.stop_timeout_floor(env_int("TTS_WORKER_STOP_GRACE", roles.WORKER_STOP_GRACE_DEFAULT))


def postgres_service(cfg: StackConfig) -> Service:
    cmd, kwargs = postgres_command(cfg)
    # SIGINT is PostgreSQL's "fast" shutdown: roll back and exit cleanly.
    return Service("postgres", cmd, popen_kwargs=kwargs, ready_port=cfg.pg_port, stop_signal=signal.SIGINT)


def start_data_services(sup: Supervisor, cfg: StackConfig) -> None:
    """PostgreSQL and Redis, initialised on first use and reused afterwards."""
    init_postgres(cfg)
    sup.start(postgres_service(cfg))
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
    wait_for_redis_data(cfg)


def wait_for_redis_data(cfg: StackConfig, timeout: float = 120) -> None:
    """Redis accepts connections before it has read its append-only file back, and answers
    every command with LOADING until then: the services started next would fail their first
    calls (a queue with many messages takes seconds to load)."""
    import redis

    client = redis.Redis.from_url(cfg.redis_url, socket_connect_timeout=2, socket_timeout=5)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise StackError(f"Redis was still loading its data after {timeout:.0f} s") from None
                time.sleep(0.1)
    finally:
        client.close()


# ----------------------------------------------------------------------------- the roles' processes


def _located(argv: list[str]) -> list[str]:
    """A role's command with its program from this venv (deploy/roles.py names it bare)."""
    return [venv_bin(argv[0]), *argv[1:]]


def gunicorn_command(
    cfg: StackConfig, workers: int | None = None, drop_privileges: bool = False
) -> list[str]:
    """The web role (deploy/gunicorn.conf.py, as tts-web.service runs it); only the socket is ours."""
    command = _located(roles.role("web").argv(root=ROOT))
    command += ["--bind", f"unix:{cfg.gunicorn_socket}"]
    # Not in $HOME, where two stacks on one machine would fight over it.
    command += ["--control-socket", str(cfg.path("run", "gunicorn.ctl")), "--chdir", str(ROOT)]
    if app_user() is not None:
        # Nginx's workers run as nobody in the app user's group: the socket (0660) is shared through it.
        command += ["--group", APP_SYSTEM_USER]
        if drop_privileges and process_user() is not None:  # the master binds the socket as root
            command += ["--user", APP_SYSTEM_USER]
    if workers is not None:
        command += ["--workers", str(workers)]
    return command  # the application (webapp.asgi) is named in gunicorn.conf.py


def worker_command(
    cfg: StackConfig,
    queues: str | None = None,
    concurrency: str | None = None,
    name: str = "",
    role: str = "synth",
) -> list[str]:
    """A Celery worker of ``role``: its queues (a synthesis pool's by TTS_WORKER_ENGINES) unless
    ``queues`` replaces them, its node ``name`` (a synthesis pool's; the role's own by default);
    without ``concurrency`` it takes its role's children from settings."""
    engines = env_list("TTS_WORKER_ENGINES", WORKER_ENGINES_DEFAULT)
    command = _located(roles.role(role).argv(engines=engines, node=name))
    at = command.index("-Q")
    if queues is not None:
        command[at + 1] = queues
    if concurrency is not None:
        command[at:at] = ["--concurrency", concurrency]
    return command


def beat_command(cfg: StackConfig) -> list[str]:
    schedule = str(cfg.path("cache", "celerybeat-schedule"))  # beat runs as the app user: its folder
    return [*_located(roles.role("beat").argv()), "--schedule", schedule]


def worker_service(cfg: StackConfig, name: str = "worker", role: str = "synth") -> Service:
    """A Celery worker as the stack runs it: stopped warm, through its parent only."""
    spec = roles.role(role)
    env = {**django_env_for(cfg, name), **spec.env}
    service = Service(name, worker_command(cfg, role=role), env=env)
    if spec.warm_stop:
        service.stop_group = False
        service.stop_timeout = worker_stop_timeout()
    return service


def role_service(cfg: StackConfig, spec: roles.Role) -> Service:
    """The stack's process of one role, under the role's name in the stack."""
    name = spec.stack_service or spec.name
    if spec.name == "web":
        service = Service(
            name,
            gunicorn_command(cfg, drop_privileges=True),
            env=django_env_for(cfg, name),
            before_start=lambda: cfg.gunicorn_socket.unlink(missing_ok=True),
        )
        if process_user() is not None:
            service.env["HOME"] = str(cfg.path("home"))
            # Its workers' files (voice prompts) as Celery's: the socket's mode is set in gunicorn.conf.py.
            service.popen_kwargs["umask"] = 0o027
    elif spec.name == "edge":  # its config rendered by deploy/nginx.py
        tcp = roles.Probe("readiness", "tcp: https") in spec.probes
        service = Service(name, nginx_command(cfg), ready_port=cfg.https_port if tcp else None)
    elif spec.name == "beat":
        service = Service(name, beat_command(cfg), env={**django_env_for(cfg, name), **spec.env})
    else:
        service = worker_service(cfg, name, spec.name)
    if spec.missing_means:  # the stack serves without it: crash-looping, it is held back
        service.required = False
        service.missing_means = spec.missing_means
    return service


def _as_app_user(cfg: StackConfig, service: Service) -> Service:
    """As root, a Celery process of `make run` runs as the unprivileged app user (deploy/privileges.py)."""
    kwargs = as_app_user()
    if kwargs:
        service.popen_kwargs.update(kwargs)
        service.env["HOME"] = str(cfg.path("home"))
    return service


def app_services(cfg: StackConfig) -> list[Service]:
    """One process of each role the stack runs, in the table's order, which is the start order
    (data services run already). gunicorn drops its privileges itself, Celery's are dropped here."""
    services = []
    for spec in roles.ROLES:
        if spec.stack_service is None:
            continue
        service = role_service(cfg, spec)
        celery = spec.django and spec.name != "web"
        services.append(_as_app_user(cfg, service) if celery else service)
    return services


def _start_everything(sup: Supervisor, cfg: StackConfig) -> None:
    prepare_var(cfg)  # secrets and folders first: the settings only read them
    start_data_services(sup, cfg)
    prepare_django(cfg, seed=True)
    secure_var_dir(cfg)
    ensure_certificate(cfg)
    for service in app_services(cfg):
        sup.start(service)


def _up_message(cfg: StackConfig) -> str:
    port = "" if cfg.https_port == 443 else f":{cfg.https_port}"
    name = socket.gethostname()
    hosts = env_str("DJANGO_ALLOWED_HOSTS", ALLOWED_HOSTS_DEFAULT)
    return (
        f"\n  The service is up: https://localhost{port}  (Ctrl-C stops everything)\n"
        f"  It answers only to {hosts} (others get 421). To reach it as {name}, run:\n"
        f"    DJANGO_ALLOWED_HOSTS={hosts},{name} DJANGO_CSRF_TRUSTED_ORIGINS=https://{name}{port} make run\n"
    )


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{' '.join(map(str, exc.cmd[:3]))} failed with status {exc.returncode}"
    if isinstance(exc, StackError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"  # details are in var/log/


def cmd_run(cfg: StackConfig) -> int:
    check_ports(cfg, ALL_PORTS)
    pidfile = cfg.path("run", "stack.pid")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(str(os.getpid()))
    sup = Supervisor(cfg)
    status = 1
    with signals_stop(sup):
        try:
            sup.starting = True
            _start_everything(sup, cfg)
            sup.starting = False
            print(_up_message(cfg), flush=True)
            status = sup.watch()
        except StackInterrupted:
            status = 0
        except Exception as exc:
            print(f"stack: {_one_line(exc)}", file=sys.stderr, flush=True)
        finally:
            sup.starting = False
            print("stack: stopping...", flush=True)
            sup.stop_all()
            with contextlib.suppress(FileNotFoundError):
                pidfile.unlink()
            print("stack: stopped", flush=True)
    return status


def _stop_left_over_services(cfg: StackConfig) -> list[str]:
    """Stop services whose supervisor is gone (killed): app tier first, then the data services."""
    records = running_from_pid_files(cfg)
    app = [r for r in records if r["name"] not in DATA_SERVICES]
    data = [r for r in records if r["name"] in DATA_SERVICES]
    stop_pids(app)
    for record in data:
        stop_pids([record])
    for record in records:
        cfg.path("run", f"{record['name']}.pid").unlink(missing_ok=True)
    return [str(r["name"]) for r in records]


def cmd_stop(cfg: StackConfig) -> int:
    pidfile = cfg.path("run", "stack.pid")
    pid = int(pidfile.read_text()) if pidfile.exists() else None
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGTERM)
        # The app tier gets the workers' grace period, each data service 30 s more.
        deadline = time.monotonic() + worker_stop_timeout() + 2 * 30 + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            print("stack: the supervisor is still stopping; run `make stop` again", file=sys.stderr)
            return 1
    pidfile.unlink(missing_ok=True)
    left = _stop_left_over_services(cfg)
    if left:
        print(f"stack: stopped {', '.join(left)} (left running by a supervisor that was killed)")
    elif pid is None:
        print("stack: not running")
        return 0
    print("stack: stopped")
    return 0


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
        check_ports(cfg, ALL_PORTS)
        return 0
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
