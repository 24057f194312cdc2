"""Recycle workers: a rolling recycle across two worker nodes under a steady stream of jobs loses nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.reliability.helpers import (
    SHORT,
    flush_queues,
    make_org,
    start_worker,
    submit,
    wait_status,
    wait_until,
)
from tests.stack import TestStack, running

pytestmark = pytest.mark.django_db(transaction=True)

CHILDREN_PER_NODE = 2
# The stream: one short job this often, for the whole recycle and a little after.
SUBMIT_EVERY = 0.4


def _ready_ids(stack: TestStack) -> set[str]:
    return {str(b["worker_id"]) for b in stack.heartbeats() if b.get("state") == "ready"}


def test_a_rolling_recycle_under_load_replaces_every_child_and_no_job_fails(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import heartbeat, rolling

    flush_queues(stack, "synth.espeak")
    stack.redis_client().delete(rolling.PLAN_KEY)
    heartbeat._client = None
    env = {"TTS_WORKER_MIN_TASKS_BEFORE_RECYCLE": "0", "TTS_WORKER_RTF_DRIFT_FACTOR": "0"}
    with (
        running(stack, start_worker(stack, "roll-a", concurrency=CHILDREN_PER_NODE, **env)),
        running(stack, start_worker(stack, "roll-b", concurrency=CHILDREN_PER_NODE, **env)),
    ):
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


def rolling_events(stack: TestStack) -> list[dict[str, Any]]:
    from webapp.speech import operations

    return operations.recycles_since(stack.redis_client(), time.time() - 600)


def test_a_request_for_a_node_with_one_child_is_refused_with_the_reason(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import heartbeat, rolling

    stack.redis_client().delete(rolling.PLAN_KEY)
    heartbeat._client = None
    with running(stack, start_worker(stack, "roll-one")):
        beats = [b for b in heartbeat.live_workers() if b.get("state") == "ready"]
        node = beats[0]["node"]
        with pytest.raises(rolling.Refused, match="only one worker child"):
            rolling.start(node, requested_by="test")
        with pytest.raises(rolling.Refused, match="queue synth.espeak has only one ready worker child"):
            rolling.start(None, requested_by="test")
        assert stack.redis_client().get(rolling.PLAN_KEY) is None
