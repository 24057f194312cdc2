"""A VoxCPM worker child is recycled after its task count, and its replacement holds what the first
child held (issue 51): the model is loaded by each child, so a recycle frees what jobs left behind.

RSS is read with psutil from the children's pids once each reported ready (loaded and warmed up).
The GPU-memory path of recycling is engine-neutral (tests/reliability/test_recycling.py with an
injected reading; tests/gpu/voxcpm_check.py measures VoxCPM's GPU memory on a device).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.voxcpm.conftest import worker_path
from tests.reliability.helpers import (
    children,
    flush_queues,
    make_org,
    start_worker,
    submit,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

MAX_TASKS = 3  # ceil(3 x 0.85) == 3: the child's own count is exactly 3 (recycling.TASK_JITTER)
# The replacement's RSS, ready, against the first child's: within this much (allocator noise, and
# the pages of the parent a child has touched) of it.
RSS_BOUND_MB = 40.0


def ready_child(stack: TestStack, worker: Any, exclude: set[int]) -> int:
    """The pid of the worker's child that is not in ``exclude`` once its heartbeat says ready."""

    def found() -> int | None:
        pids = {p.pid for p in children(worker)} - exclude
        beats = [b for b in stack.heartbeats() if b.get("pid") in pids and b.get("state") == "ready"]
        return int(beats[0]["pid"]) if beats else None

    return int(wait_until(found, 60, "a ready child"))


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


@pytest.mark.django_db(transaction=True)
def test_a_voxcpm_child_is_recycled_after_its_tasks_and_its_replacement_holds_what_the_first_held(
    stack: TestStack, voxcpm_models: Path, voxcpm_site: Path, no_session_worker: None
) -> None:
    from webapp.speech.runtime import recycling

    flush_queues(stack, "synth.voxcpm")
    worker = start_worker(
        stack,
        "voxcpm-recycle",
        engines="voxcpm",
        PYTHONPATH=worker_path(voxcpm_site),
        TTS_MODELS_DIR=str(voxcpm_models),
        TTS_WORKER_MAX_TASKS_PER_CHILD=str(MAX_TASKS),
    )
    try:
        first = ready_child(stack, worker, set())
        first_rss = rss_mb(first)
        org = make_org("voxcpm-recycle")
        texts = ["Hello there. Again.", "The keeper climbed the stairs.", "Is this a question?"]
        rows = wait_status([submit(org, t, voice="voxcpm:default").id for t in texts], timeout=90)
        assert [r.status for r in rows] == ["succeeded"] * MAX_TASKS
        assert {r.metrics["pid"] for r in rows} == {first}
        grown = max(r.metrics["child_rss_before_mb"] for r in rows)

        second = ready_child(stack, worker, {first})
        assert first not in {p.pid for p in children(worker)}  # the first child left
        second_rss = rss_mb(second)
        node = rows[0].metrics["node"]
        stats = wait_until(
            lambda: (s := recycling.node_stats(stack.redis_client(), node))["recycles"] >= 1 and s,
            10,
            "the recycle to be recorded",
        )
        assert stats["recycle_reasons"] == {"max_tasks": 1}, stats
        print(
            f"\nvoxcpm child RSS: first ready {first_rss:.1f} MiB, before its last job {grown:.1f} MiB;"
            f" replacement ready {second_rss:.1f} MiB"
        )
        assert abs(second_rss - first_rss) <= RSS_BOUND_MB, (first_rss, grown, second_rss)
        (after,) = wait_status([submit(org, "One more.", voice="voxcpm:default").id], timeout=60)
        assert after.status == "succeeded" and after.metrics["pid"] == second
    finally:
        stack.stop_service(worker)
