"""A second worker node in its own network namespace joins the same Redis and PostgreSQL.

The node reaches the data services only through a veth pair, by IP and with
passwords; its own loopback has nothing listening (see tests.reliability.nodes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

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
from tests.reliability.nodes import second_node, start_worker_on
from tests.stack import CFG, TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def test_worker_in_a_network_namespace_serves_the_same_queue(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.espeak")
    with second_node(stack) as link:
        # Nothing answers on the node's own loopback: it can only use the veth.
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                link.netns,
                "python3",
                "-c",
                f"import socket; socket.create_connection(('127.0.0.1', {CFG.pg_port}), timeout=2)",
            ],
            capture_output=True,
        )
        assert probe.returncode != 0
        env = link.env(
            "node2",
            TTS_WORKER_ENGINES="espeak",
            TTS_HEARTBEAT_INTERVAL="0.5",
        )
        command = deploy_stack.worker_command(CFG, queues="synth.espeak", concurrency="1", name="node2")
        node = stack.start_service(Service("node2", link.command(command), env=env))
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
    with second_node(stack) as link:
        env = link.env(
            "node2",
            TTS_WORKER_ENGINES="piper",
            TTS_HEARTBEAT_INTERVAL="0.5",
            TTS_HEARTBEAT_TTL="2",
            TTS_JOB_LEASE_SECONDS="10",
        )
        command = deploy_stack.worker_command(CFG, queues="synth.piper", concurrency="1", name="node2")
        node = stack.start_service(
            Service("node2", link.command(command, hostname="tts-node2", own_pids=True), env=env)
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
            assert node.process is not None
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
