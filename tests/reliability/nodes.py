"""A second worker node for tests: its own network namespace, reaching the data services over a veth pair.

The node reaches PostgreSQL and Redis only through the pair (198.18.0.0/15,
the range reserved for network tests), by IP and with passwords; its own
loopback has nothing listening. PostgreSQL and Redis of the test stack are
made to listen on the host side of the pair for the test and put back after.

Each test process gets its own /30 pair, chosen from its pid, and its own
namespace and veth names, so two test runs (each with its own stack) can use
second nodes at the same time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from deploy import provision
from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.stack import CFG, TestStack, django_env

# 198.18.0.0/15 holds 32768 /30 blocks; block 0 (198.18.0.0/30) is left out: older copies
# of these tests used it as a fixed pair.
_BLOCKS = 32768


@dataclass(frozen=True)
class Link:
    """A network namespace and the veth pair joining it to the host."""

    netns: str
    veth: str
    host_ip: str
    node_ip: str

    def env(self, process: str, **overrides: str) -> dict[str, str]:
        """A worker's environment on the node: the data services by the host's address on the pair."""
        return django_env(
            process,
            DJANGO_SETTINGS_MODULE="webapp.settings",
            DATABASE_URL=f"postgres://tts:{CFG.pg_password}@{self.host_ip}:{CFG.pg_port}/tts",
            REDIS_URL=f"redis://:{CFG.redis_password}@{self.host_ip}:{CFG.redis_port}/0",
            **overrides,
        )

    def command(self, command: list[str], hostname: str | None = None, own_pids: bool = False) -> list[str]:
        """``command`` run inside the namespace; with ``hostname``, under its own host name (UTS
        namespace), and with ``own_pids`` also in its own pid namespace (pids there may equal ours)."""
        prefix = ["ip", "netns", "exec", self.netns]
        if hostname is None:
            return [*prefix, *command]
        isolate = ["unshare", "--uts"]
        if own_pids:
            isolate += ["--pid", "--fork", "--mount-proc"]
        rename = ["sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", hostname]
        return [*prefix, *isolate, *rename, *command]


def link_for(pid: int) -> Link:
    block = pid % (_BLOCKS - 1) + 1
    base = block * 4
    prefix = f"198.{18 + (base >> 16)}.{(base >> 8) & 255}"
    return Link(
        netns=f"tts-node2-{pid}",
        veth=f"tts2h{pid % 100000}",
        host_ip=f"{prefix}.{(base & 255) + 1}",
        node_ip=f"{prefix}.{(base & 255) + 2}",
    )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def network_namespace() -> Iterator[Link]:
    link = link_for(os.getpid())
    peer = link.veth + "n"
    try:
        _ip("netns", "add", link.netns)
        _ip("link", "add", link.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", link.netns)
        _ip("addr", "add", f"{link.host_ip}/30", "dev", link.veth)
        _ip("link", "set", link.veth, "up")
        _ip("netns", "exec", link.netns, "ip", "addr", "add", f"{link.node_ip}/30", "dev", peer)
        _ip("netns", "exec", link.netns, "ip", "link", "set", peer, "up")
        _ip("netns", "exec", link.netns, "ip", "link", "set", "lo", "up")
        yield link
    finally:
        subprocess.run(["ip", "link", "del", link.veth], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", link.netns], capture_output=True, check=False)


def _restart_postgres(stack: TestStack) -> None:
    from django.db import connections

    connections.close_all()
    pg = next(s for s in stack.sup.services if s.name == "postgres")
    stack.stop_service(pg, sig=signal.SIGINT)
    cmd, kwargs = deploy_stack.postgres_command(CFG)
    stack.start_service(
        Service("postgres", cmd, popen_kwargs=kwargs, ready_port=CFG.pg_port, stop_signal=signal.SIGINT)
    )


def _psql(sql: str) -> None:
    """As the cluster's superuser: the app's role may not change the server's settings."""
    done = provision.psql(CFG, provision.PG_ADMIN_ROLE, CFG.pg_admin_password, sql)
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def data_services_on(address: str, stack: TestStack) -> Iterator[None]:
    """PostgreSQL and Redis also listen on ``address`` (password required), for the test only."""
    hba = CFG.pg_data / "pg_hba.conf"
    original_hba = hba.read_text()
    r = stack.redis_client()
    try:
        with hba.open("a") as fh:
            fh.write(f"host all all {address}/30 scram-sha-256\n")
        _psql(f"ALTER SYSTEM SET listen_addresses = '127.0.0.1,{address}'")
        _restart_postgres(stack)  # listen_addresses needs a restart
        r.config_set("bind", f"127.0.0.1 {address}")
        yield
    finally:
        with contextlib.suppress(Exception):
            r.config_set("bind", "127.0.0.1")
        hba.write_text(original_hba)
        with contextlib.suppress(Exception):
            _psql("ALTER SYSTEM RESET listen_addresses")
        _restart_postgres(stack)


@contextlib.contextmanager
def second_node(stack: TestStack) -> Iterator[Link]:
    """A network namespace whose workers reach this stack's PostgreSQL and Redis over the veth pair."""
    with network_namespace() as link, data_services_on(link.host_ip, stack):
        yield link


def start_worker_on(stack: TestStack, name: str, queue: str) -> Service:
    """A Piper worker here (not on the node) serving ``queue`` only."""
    env = {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "TTS_WORKER_ENGINES": "piper",
        "TTS_HEARTBEAT_INTERVAL": "0.5",
        "TTS_HEARTBEAT_TTL": "2",
    }
    return stack.start_worker(name, queues=queue, concurrency="1", env=env)
