"""Workers die with real signals; every job still finishes exactly once and is charged once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.reliability.helpers import (
    ESPEAK,
    LONG,
    PIPER,
    SHORT,
    WorkerEnv,
    children,
    flush_queues,
    job,
    kill_group,
    make_org,
    media_root,
    partial_files,
    start_worker,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def _running_owner(job_id: object) -> int:
    """Wait until the job is mid-synthesis; the pid of the child running it."""
    wait_until(
        lambda: job(job_id).stage.startswith("synthesising 2/"), 60, "the job to be mid-synthesis", 0.02
    )
    return int(job(job_id).worker.rpartition(":")[2])


def test_kill_9_child_mid_job_completes_once_within_seconds(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "w-kill-child", engines="piper")
    try:
        org = make_org("kill-child")
        j = submit(org, LONG, voice=PIPER)
        victim = _running_owner(j.id)
        assert victim in {p.pid for p in children(worker)}
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        (row,) = wait_status([j.id], timeout=60)
        recovered_in = time.monotonic() - killed_at
        assert row.status == "succeeded", (row.error_code, row.error_message)
        assert row.attempts == 2
        assert row.metrics["pid"] != victim
        # Recovery came from the redelivered message and the dead-pid check, not the 60 s lease.
        assert recovered_in < 30, recovered_in
        print(f"\nkill -9 child: job finished {recovered_in:.1f} s after the kill")
        assert usage_events(j.id) == ["charge", "reserve"]
        assert not partial_files(os.path.join(media_root(), "audio", str(org.id)))
        assert worker.process is not None and worker.process.poll() is None
    finally:
        stack.stop_service(worker)


def test_kill_9_whole_worker_then_a_new_worker_completes_once(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import lifecycle

    flush_queues(stack, "synth.piper")
    env: WorkerEnv = {"TTS_JOB_LEASE_SECONDS": "2"}
    first = start_worker(stack, "w-node-a", engines="piper", **env)
    second = None
    try:
        org = make_org("kill-node")
        j = submit(org, LONG, voice=PIPER)
        _running_owner(j.id)
        kill_group(first)  # parent and child at once, as when the machine dies
        assert job(j.id).status == "running"
        second = start_worker(stack, "w-node-b", engines="piper", **env)
        # Beat's reaper (called directly here): the dead run's lease runs out, the job is re-queued.
        requeued = wait_until(
            lambda: lifecycle.requeue_expired_leases()[0], 30, "the lease reaper to re-queue"
        )
        assert requeued == 1
        (row,) = wait_status([j.id], timeout=60)
        assert row.status == "succeeded", (row.error_code, row.error_message)
        assert row.attempts == 2
        assert row.metrics["pid"] in {p.pid for p in children(second)}
        assert usage_events(j.id) == ["charge", "reserve"]
        assert not partial_files(os.path.join(media_root(), "audio", str(org.id)))
    finally:
        if first.process is not None and first.process.poll() is None:
            stack.stop_service(first)
        if second is not None:
            stack.stop_service(second)


def test_job_that_kills_its_worker_every_time_fails_worker_lost(
    stack: TestStack, builtin_voices: list[str], tmp_path: Path
) -> None:
    flush_queues(stack, "synth.espeak")
    marker = "#crash-me#"
    record = tmp_path / "crashes"
    worker = start_worker(
        stack,
        "w-crash",
        TTS_FAULT_CRASH_MARKER=marker,
        TTS_FAULT_CRASH_RECORD=str(record),
        TTS_JOB_MAX_ATTEMPTS="3",
    )
    try:
        org = make_org("crash")
        bad = submit(org, f"This text {marker} kills the worker. It dies in the middle of writing.")
        good = [submit(org, f"{SHORT} Number {i}.") for i in range(3)]
        rows = wait_status([bad.id, *(g.id for g in good)], timeout=90)
        assert rows[0].status == "failed" and rows[0].error_code == "worker_lost", rows[0].error_message
        assert rows[0].attempts == 3
        assert usage_events(bad.id) == ["release", "reserve"]
        assert [r.status for r in rows[1:]] == ["succeeded"] * 3
        # Each attempt (1, 2, 3) died mid-write, its partial and stream files on disk ...
        deaths = [line.split() for line in record.read_text().splitlines()]
        assert [(d[0], d[1]) for d in deaths] == [(str(bad.id), str(n)) for n in (1, 2, 3)], deaths
        assert all(int(d[2]) >= 2 for d in deaths), deaths
        # ... and none is left: each claim that found the owner dead removed what it wrote (the last
        # one's files go once the failure committed, as the job's status is read: moments apart).
        folder = os.path.join(media_root(), "audio", str(org.id))
        wait_until(lambda: not partial_files(folder), 10, "the dead attempts' partial files removed")
        # The same worker is still there and serving.
        assert worker.process is not None and worker.process.poll() is None
        after = submit(org, SHORT)
        (row,) = wait_status([after.id], timeout=30)
        assert row.status == "succeeded"
    finally:
        stack.stop_service(worker)


def test_out_of_memory_requeues_once_on_a_fresh_child_then_fails(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech.runtime import recycling

    flush_queues(stack, "synth.espeak")
    marker = "#oom#"
    worker = start_worker(stack, "w-oom", TTS_FAULT_OOM_MARKER=marker)
    try:
        org = make_org("oom")
        first_child = {p.pid for p in children(worker)}
        bad = submit(org, f"This text {marker} exhausts memory.")
        (row,) = wait_status([bad.id], timeout=60)
        assert row.status == "failed" and row.error_code == "resource_exhausted", row.error_message
        assert row.oom_retries == 1 and row.attempts == 2
        assert usage_events(bad.id) == ["release", "reserve"]
        # Each out-of-memory run recycled its child.
        wait_until(
            lambda: not (first_child & {p.pid for p in children(worker)}), 30, "the child to be replaced"
        )
        beat = wait_until(
            lambda: [b for b in stack.heartbeats() if b.get("state") == "ready"], 30, "a ready child"
        )
        stats = recycling.node_stats(stack.redis_client(), beat[0]["node"])
        assert stats["recycle_reasons"].get("oom") == 2, stats
        ok = submit(org, SHORT, voice=ESPEAK)
        (done,) = wait_status([ok.id], timeout=30)
        assert done.status == "succeeded"
    finally:
        stack.stop_service(worker)
