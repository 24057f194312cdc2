"""The services the tests run against, started by the tests themselves.

PostgreSQL and Redis once per session; Celery workers, gunicorn and Nginx on
demand. All under var/test/ on the test ports, so `make run` data is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import redis

from deploy import stack as deploy_stack
from deploy.stack import Service, StackConfig, Supervisor

CFG = StackConfig.for_tests()

# Ports for the extra listeners a test starts (one more Nginx, a restored PostgreSQL). Like every
# fixed port they lie below the kernel's ephemeral range (32768 and up), where an outgoing
# connection can hold a port for minutes: a port the kernel handed out by binding to 0 could be
# taken by such a connection before the listener binds it. None of the fixed ports is in here.
SPARE_PORTS = range(21000, 29000)


def spare_port() -> int:
    """A port in SPARE_PORTS that nothing on 127.0.0.1 holds right now."""
    for port in random.sample(SPARE_PORTS, 64):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {SPARE_PORTS}")


def django_env(process: str, **overrides: str) -> dict[str, str]:
    env = deploy_stack.django_env_for(CFG, process)
    env.update({"DJANGO_SETTINGS_MODULE": "tests.settings", "TTS_FAST_PASSWORD_HASHER": "1"})
    env.update(overrides)
    return env


def side_gunicorn_env(process: str, **overrides: str) -> dict[str, str]:
    """For a gunicorn started beside the stack's own: a metrics folder of its own. Every gunicorn
    empties its folder when it starts (webapp/metrics/multiproc.py), so sharing the stack's would
    wipe the counters the stack's workers keep writing (to files no longer in the folder)."""
    folder = CFG.path("run", f"prometheus-{process}")
    return django_env(process, PROMETHEUS_MULTIPROC_DIR=str(folder), **overrides)


@contextlib.contextmanager
def tcp_gunicorn(stack: TestStack, name: str, **overrides: str) -> Iterator[int]:
    """A gunicorn of its own (one worker) on 127.0.0.1:<port>, over TCP as Kubernetes' edge reaches
    web, with its own folder, metrics and ``overrides`` of the environment; yields the port."""
    port = spare_port()
    cfg = dataclasses.replace(CFG, var_dir=CFG.path(name))
    cfg.path("run").mkdir(parents=True, exist_ok=True)
    command = deploy_stack.gunicorn_command(cfg, workers=1)
    command[command.index("--bind") + 1] = f"127.0.0.1:{port}"
    service = stack.start_service(
        Service(name, command, env=side_gunicorn_env(name, **overrides), ready_port=port), timeout=30
    )
    try:
        yield port
    finally:
        stack.stop_service(service)


class TestStack:
    __test__ = False  # not a test class, despite its name

    def __init__(self) -> None:
        self.cfg = CFG
        self.sup = Supervisor(CFG, echo=False)
        self.session_worker: Service | None = None
        self.redis = None

    def start_data(self) -> None:
        deploy_stack.check_ports(CFG, ["pg_port", "redis_port"])
        deploy_stack.prepare_var(CFG)  # as `make run`: secrets and folders before any service
        deploy_stack.start_data_services(self.sup, CFG)

    def redis_client(self) -> redis.Redis:
        return redis.Redis.from_url(CFG.redis_url, decode_responses=True)

    def start_service(self, service: Service, timeout: float = 60) -> Service:
        return self.sup.start(service, timeout=timeout)

    def stop_service(self, service: Service, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        proc = service.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if service in self.sup.services:
            self.sup.services.remove(service)

    def start_worker(
        self,
        name: str = "worker",
        queues: str | None = None,
        concurrency: str = "1",
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        timeout: float = 120,
    ) -> Service:
        command = deploy_stack.worker_command(CFG, queues=queues, concurrency=concurrency, name=name)
        service = self.start_service(Service(name, command, env=django_env(name, **(env or {}))))
        if wait_ready:
            self.wait_for_workers(service, int(concurrency), timeout)
        return service

    def ensure_session_worker(self) -> Service:
        """The shared synthesis worker most tests use, started on first need.

        Ready, not just running: after a test that killed its child, the parent's new child may
        still be loading its models, and a test that needs a serving worker must wait for it.
        """
        worker = self.session_worker
        if worker is None or worker.process is None or worker.process.poll() is not None:
            self.session_worker = worker = self.start_worker("worker")
        else:
            self.wait_for_workers(worker, 1, timeout=120)
        return worker

    def stop_session_worker(self) -> None:
        """Tests that run their own workers on the same queues must not share the messages."""
        if self.session_worker is not None:
            self.stop_service(self.session_worker)
            self.session_worker = None

    def heartbeats(self) -> list[dict[str, Any]]:
        r = self.redis_client()
        out = []
        for key in r.scan_iter(match="tts:heartbeat:*"):
            raw = r.get(key)
            if raw:
                out.append(json.loads(raw))
        return out

    def wait_for_workers(self, service: Service, count: int, timeout: float) -> list[dict[str, Any]]:
        assert service.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise RuntimeError(
                    f"{service.name} exited with {service.process.returncode}; see {CFG.log_dir}"
                )
            children = {p.pid for p in _children(service.process.pid)}
            ready = [h for h in self.heartbeats() if h.get("state") == "ready" and h.get("pid") in children]
            if len(ready) >= count:
                return ready
            time.sleep(0.2)
        raise RuntimeError(f"{service.name}: {count} ready children not seen within {timeout}s")

    def start_web(self, env: dict[str, str] | None = None) -> list[Service]:
        """gunicorn on its Unix socket and Nginx on the test ports."""
        deploy_stack.check_ports(CFG, ["http_port", "https_port"])
        if CFG.gunicorn_socket.exists():
            CFG.gunicorn_socket.unlink()
        gunicorn = self.start_service(
            Service("gunicorn", deploy_stack.gunicorn_command(CFG), env=django_env("gunicorn", **(env or {})))
        )
        deadline = time.monotonic() + 30
        while not CFG.gunicorn_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not create its socket")
            time.sleep(0.1)
        nginx = self.start_service(
            Service("nginx", deploy_stack.nginx_command(CFG), ready_port=CFG.https_port)
        )
        return [gunicorn, nginx]

    def stop_all(self) -> None:
        self.sup.stop_all()


def _children(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@contextlib.contextmanager
def running(stack: TestStack, service: Service) -> Iterator[Service]:
    try:
        yield service
    finally:
        stack.stop_service(service)
