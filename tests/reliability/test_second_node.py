"""A second worker node in its own network namespace joins the same Redis and PostgreSQL.

The node reaches the data services only through a veth pair (198.18.0.0/15,
the range reserved for network tests), by IP and with passwords; its own
loopback has nothing listening. PostgreSQL and Redis of the test stack are
made to listen on the host side of the pair for the test and put back after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.reliability.helpers import (
    LONG,
    PIPER,
    SHORT,
    children,
    flush_queues,
    job,
    make_org,
    media_root,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import CFG, TestStack, django_env

pytestmark = pytest.mark.django_db(transaction=True)

HOST_IP = "198.18.0.1"
NODE_IP = "198.18.0.2"
NETNS = f"tts-node2-{os.getpid()}"
VETH = f"tts2h{os.getpid() % 100000}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def network_namespace() -> Iterator[str]:
    peer = VETH + "n"
    try:
        _ip("netns", "add", NETNS)
        _ip("link", "add", VETH, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", NETNS)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", VETH)
        _ip("link", "set", VETH, "up")
        _ip("netns", "exec", NETNS, "ip", "addr", "add", f"{NODE_IP}/30", "dev", peer)
        _ip("netns", "exec", NETNS, "ip", "link", "set", peer, "up")
        _ip("netns", "exec", NETNS, "ip", "link", "set", "lo", "up")
        yield NETNS
    finally:
        subprocess.run(["ip", "link", "del", VETH], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)


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
    env = {**os.environ, "PGPASSWORD": CFG.pg_password}
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(CFG.pg_port), "-U", "tts", "-d", "tts", "-tAc", sql],
        env=env,
        check=True,
        capture_output=True,
    )


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


def test_worker_in_a_network_namespace_serves_the_same_queue(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.espeak")
    with network_namespace() as ns, data_services_on(HOST_IP, stack):
        # Nothing answers on the node's own loopback: it can only use the veth.
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "python3",
                "-c",
                f"import socket; socket.create_connection(('127.0.0.1', {CFG.pg_port}), timeout=2)",
            ],
            capture_output=True,
        )
        assert probe.returncode != 0
        env = django_env(
            "node2",
            DJANGO_SETTINGS_MODULE="webapp.settings",
            DATABASE_URL=f"postgres://tts:{CFG.pg_password}@{HOST_IP}:{CFG.pg_port}/tts",
            REDIS_URL=f"redis://:{CFG.redis_password}@{HOST_IP}:{CFG.redis_port}/0",
            TTS_WORKER_ENGINES="espeak",
            TTS_HEARTBEAT_INTERVAL="0.5",
        )
        command = deploy_stack.worker_command(CFG, queues="synth.espeak", concurrency="1", name="node2")
        node = stack.start_service(Service("node2", ["ip", "netns", "exec", ns, *command], env=env))
        try:
            stack.wait_for_workers(node, 1, 120)
            node_pids = {p.pid for p in children(node)}
            org = make_org("node2")
            rows = wait_status([submit(org, f"{SHORT} From node two, {i}.").id for i in range(3)], timeout=60)
            assert [r.status for r in rows] == ["succeeded"] * 3
            for r in rows:
                assert r.metrics["pid"] in node_pids, r.metrics
                assert os.path.getsize(os.path.join(media_root(), r.audio_path)) == r.audio_bytes > 0
                assert usage_events(r.id) == ["charge", "reserve"]
            # Its heartbeat reached the shared Redis over the veth pair.
            beat = wait_until(
                lambda: [
                    b for b in stack.heartbeats() if b.get("pid") in node_pids and b.get("state") == "ready"
                ],
                10,
                "the node's heartbeat",
            )[0]
            assert "espeak-en-us" in beat["voices"]
        finally:
            stack.stop_service(node)


def _node_heartbeats(stack: TestStack, host: str) -> list[dict[str, object]]:
    return [b for b in stack.heartbeats() if b.get("host") == host]


def _lease_expired(job_id: object) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_until < now() FROM speech_synthesisjob WHERE id = %s", [str(job_id)])
        return bool(cursor.fetchone()[0])


def test_a_node_whose_heartbeat_stops_keeps_its_job_until_its_lease_expires(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    """Its own host name and pid namespace: only the heartbeat and the lease can say it is gone."""
    from webapp.speech.tasks import synthesize_job

    host_queue = "synth.host-only"
    flush_queues(stack, "synth.piper", host_queue)
    # The node's own pids may equal ours: only "host:...:pid" ids that differ by host keep them apart.
    here = start_worker_on(stack, "w-here", host_queue)
    with network_namespace() as ns, data_services_on(HOST_IP, stack):
        env = django_env(
            "node2",
            DJANGO_SETTINGS_MODULE="webapp.settings",
            DATABASE_URL=f"postgres://tts:{CFG.pg_password}@{HOST_IP}:{CFG.pg_port}/tts",
            REDIS_URL=f"redis://:{CFG.redis_password}@{HOST_IP}:{CFG.redis_port}/0",
            TTS_WORKER_ENGINES="piper",
            TTS_HEARTBEAT_INTERVAL="0.5",
            TTS_HEARTBEAT_TTL="2",
            TTS_JOB_LEASE_SECONDS="10",
        )
        command = deploy_stack.worker_command(CFG, queues="synth.piper", concurrency="1", name="node2")
        isolated = [
            "unshare",
            "--uts",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            'hostname tts-node2 && exec "$@"',
            "sh",
        ]
        node = stack.start_service(
            Service("node2", ["ip", "netns", "exec", ns, *isolated, *command], env=env)
        )
        try:
            wait_until(
                lambda: [b for b in _node_heartbeats(stack, "tts-node2") if b.get("state") == "ready"],
                120,
                "the node's child to be ready",
            )
            org = make_org("node2-lease")
            j = submit(org, " ".join([LONG] * 2), voice=PIPER)
            wait_until(lambda: job(j.id).progress >= 0.2, 60, "the node to be mid-job", 0.02)
            owner = job(j.id).worker
            assert owner.startswith("tts-node2:")
            os.killpg(node.process.pid, signal.SIGSTOP)  # the whole node freezes: no beat, no progress
            frozen = time.monotonic()
            wait_until(lambda: not _node_heartbeats(stack, "tts-node2"), 10, "the node's heartbeat to expire")
            assert not _lease_expired(j.id)
            # A message for the job reaches a worker here while the lease is still valid: it is not stolen.
            synthesize_job.apply_async(args=(str(j.id),), queue=host_queue)
            wait_until(lambda: stack.redis_client().llen(host_queue) == 0, 10, "the message to be taken")
            time.sleep(1.0)
            row = job(j.id)
            assert (row.status, row.worker, row.attempts) == ("running", owner, 1)
            assert not _lease_expired(j.id) and time.monotonic() - frozen < 10
            # Once the lease has run out as well, the next message takes it over.
            wait_until(lambda: _lease_expired(j.id), 20, "the lease to expire")
            synthesize_job.apply_async(args=(str(j.id),), queue=host_queue)
            (row,) = wait_status([j.id], timeout=90)
            assert row.status == "succeeded" and row.attempts == 2, (row.error_code, row.error_message)
            assert not row.worker.startswith("tts-node2:")
            assert usage_events(j.id) == ["charge", "reserve"]
        finally:
            if node.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGCONT)
            stack.stop_service(node)
            stack.stop_service(here)


def start_worker_on(stack: TestStack, name: str, queue: str) -> Service:
    env = {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "TTS_WORKER_ENGINES": "piper",
        "TTS_HEARTBEAT_INTERVAL": "0.5",
        "TTS_HEARTBEAT_TTL": "2",
    }
    return stack.start_worker(name, queues=queue, concurrency="1", env=env)
