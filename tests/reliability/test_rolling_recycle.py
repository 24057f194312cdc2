"""Recycle workers: a rolling recycle across two worker nodes under a steady stream of jobs loses nothing.

The second node is a real one: its own network namespace (it reaches PostgreSQL
and Redis over a veth pair) and its own host name, so its heartbeats, node id
and worker ids are its own (tests.reliability.nodes).
"""

from __future__ import annotations

import socket
import threading
import time
from itertools import pairwise
from typing import Any

import pytest

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.reliability.helpers import (
    SHORT,
    flush_queues,
    make_org,
    start_worker,
    submit,
    wait_status,
    wait_until,
)
from tests.reliability.nodes import Link, second_node
from tests.stack import CFG, TestStack, running

pytestmark = pytest.mark.django_db(transaction=True)

CHILDREN_PER_NODE = 2
# The stream: one short job this often, for the whole recycle and a little after.
SUBMIT_EVERY = 0.4
NODE_HOST = "tts-roll-node2"
# Only the operator's plan replaces children here: no RTF-drift recycle, and a child with few tasks
# done is not held back.
WORKER_ENV = {"TTS_WORKER_MIN_TASKS_BEFORE_RECYCLE": "0", "TTS_WORKER_RTF_DRIFT_FACTOR": "0"}


def _ready_ids(stack: TestStack) -> set[str]:
    return {str(b["worker_id"]) for b in stack.heartbeats() if b.get("state") == "ready"}


def _start_node_worker(stack: TestStack, link: Link, name: str) -> Service:
    env = link.env(
        name,
        TTS_WORKER_ENGINES="espeak",
        TTS_HEARTBEAT_INTERVAL="0.5",
        TTS_HEARTBEAT_TTL="3",
        **WORKER_ENV,
    )
    command = deploy_stack.worker_command(
        CFG, queues="synth.espeak", concurrency=str(CHILDREN_PER_NODE), name=name
    )
    node = stack.start_service(Service(name, link.command(command, hostname=NODE_HOST), env=env))
    stack.wait_for_workers(node, CHILDREN_PER_NODE, 120)
    return node


def _assert_one_child_at_a_time(stack: TestStack, plan: dict[str, Any]) -> None:
    """Before each child left, the one before it had exited and its replacement was ready."""
    from webapp.speech import operations
    from webapp.speech.runtime import recycling, rolling

    r = stack.redis_client()
    since = float(plan["requested_at"])
    events = [
        {**e, "node": node}
        for node in operations.event_nodes(r)
        for e in recycling.node_events(r, node)
        if float(e.get("at", 0)) >= since
    ]
    leaving = sorted(
        (e for e in events if e["event"] == "recycle" and e.get("reason") == rolling.reason(plan)),
        key=lambda e: float(e["at"]),
    )
    for previous, this in pairwise(leaving):
        (gone,) = [
            float(e["at"])
            for e in events
            if e["event"] == "exit" and (e["node"], e["pid"]) == (previous["node"], previous["pid"])
        ]
        assert gone < float(this["at"]), (previous, this)
        # A replacement publishes its ready heartbeat a moment before it records the event.
        ready = [float(e["at"]) for e in events if e["event"] == "ready" and e["node"] == previous["node"]]
        assert any(gone < at <= float(this["at"]) + 0.25 for at in ready), (previous, this, ready)


def test_a_rolling_recycle_under_load_replaces_every_child_and_no_job_fails(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import heartbeat
    from webapp.speech.runtime import rolling

    flush_queues(stack, "synth.espeak")
    stack.redis_client().delete(rolling.PLAN_KEY)
    with (
        second_node(stack) as link,
        running(stack, start_worker(stack, "roll-a", "espeak", CHILDREN_PER_NODE, True, **WORKER_ENV)),
        running(stack, _start_node_worker(stack, link, "roll-b")),
    ):
        beats = [b for b in stack.heartbeats() if b.get("state") == "ready"]
        # Two nodes in earnest: each with its own host name, node id and children.
        assert sorted(str(b["host"]) for b in beats) == sorted(
            [socket.gethostname()] * CHILDREN_PER_NODE + [NODE_HOST] * CHILDREN_PER_NODE
        )
        assert len({b["node"] for b in beats}) == 2
        before = _ready_ids(stack)
        assert len(before) == 2 * CHILDREN_PER_NODE
        org = make_org("rolling")
        submitted: list[Any] = []
        stop = threading.Event()

        def stream() -> None:
            from django.db import connection

            try:
                while not stop.is_set():
                    submitted.append(submit(org, f"Job {len(submitted)}. {SHORT}"))
                    time.sleep(SUBMIT_EVERY)
            finally:
                connection.close()

        feeder = threading.Thread(target=stream, name="job-stream")
        feeder.start()
        try:
            time.sleep(2)
            plan = rolling.start(None, requested_by="test")
            assert sorted(plan["order"]) == sorted(before)
            assert len(plan["nodes"]) == 2
            # While it runs, a second request is refused.
            with pytest.raises(rolling.Refused, match="already in progress"):
                rolling.start(None, requested_by="test")
            started = time.monotonic()
            wait_until(
                lambda: rolling.progress(plan, heartbeat.live_workers()).done,
                150,
                "every child to be replaced",
                interval=0.5,
            )
            took = time.monotonic() - started
            time.sleep(2)
        finally:
            stop.set()
            feeder.join(30)
        after = _ready_ids(stack)
        assert not (after & before), "every original child was replaced"
        assert len(after) == 2 * CHILDREN_PER_NODE

        rows = wait_status([j.id for j in submitted], timeout=60)
        assert [r.status for r in rows] == ["succeeded"] * len(rows), {r.status for r in rows}
        # Both nodes served the stream.
        assert {r.worker.partition(":")[0] for r in rows} == {socket.gethostname(), NODE_HOST}
        # Longest gap in service: the longest time between two consecutive job completions
        # while the stream ran (a job is submitted every SUBMIT_EVERY s, each takes a fraction of that).
        done = sorted(r.finished_at for r in rows)
        gaps = [(b - a).total_seconds() for a, b in zip(done, done[1:], strict=False)]
        longest = max(gaps)
        print(
            f"\nrolling recycle of {len(before)} children on 2 nodes: {took:.1f} s, {len(rows)} jobs, "
            f"all succeeded; longest gap between completions {longest:.2f} s"
        )
        assert longest < 5.0
        reasons = [e for e in rolling_events(stack) if e.get("reason", "") == rolling.reason(plan)]
        assert len(reasons) == len(before)
        assert len({e["node"] for e in reasons}) == 2
        _assert_one_child_at_a_time(stack, plan)


def rolling_events(stack: TestStack) -> list[dict[str, Any]]:
    from webapp.speech import operations

    return operations.recycles_since(stack.redis_client(), time.time() - 600)


def test_a_request_for_a_node_with_one_child_is_refused_with_the_reason(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import heartbeat
    from webapp.speech.runtime import rolling

    stack.redis_client().delete(rolling.PLAN_KEY)
    with running(stack, start_worker(stack, "roll-one")):
        beats = [b for b in heartbeat.live_workers() if b.get("state") == "ready"]
        node = beats[0]["node"]
        with pytest.raises(rolling.Refused, match="only one worker child"):
            rolling.start(node, requested_by="test")
        with pytest.raises(rolling.Refused, match="queue synth.espeak has only one ready worker child"):
            rolling.start(None, requested_by="test")
        assert stack.redis_client().get(rolling.PLAN_KEY) is None
