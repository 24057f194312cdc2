"""Time limits follow the row and progress: a job hung in native code ends `timeout` after one
attempt and its child is replaced, a stalled one ends `timeout` too; a job slowed by a busy host but advancing is not stopped (its soft limit is CPU time)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.reliability.helpers import (
    LONG,
    PIPER,
    SHORT,
    children,
    flush_queues,
    job,
    make_org,
    pause_while_running,
    start_worker,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_stuck_in_native_code_past_its_hard_limit_ends_timeout_and_its_child_is_replaced(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    """Stuck in C with SIGALRM blocked (libc pause): the child's alarm never fires. The reaper
    ends the job ``timeout``; the child's watchdog then ends the child, which would otherwise
    keep the message and say "ready" until Celery's own limit."""
    from webapp.housekeeping.catalog import run_job

    flush_queues(stack, "synth.espeak")
    marker = "#native-hang#"
    worker = start_worker(
        stack, "w-hang", TTS_FAULT_NATIVE_HANG_MARKER=marker, TTS_JOB_HARD_GRACE_SECONDS="2"
    )
    try:
        org = make_org("hang")
        # Soft 1 s of CPU, hard 4 s (3 x soft + 1): sent with the message, the deadline on the row.
        with override_settings(
            TTS_JOB_BASE_SECONDS=1.0, TTS_JOB_SECONDS_PER_CHAR=0.0, TTS_JOB_HARD_GRACE_SECONDS=1
        ):
            hung = submit(org, f"This text {marker} never finishes.")
        row = wait_until(lambda: (r := job(hung.id)).status == "running" and r, 30, "the job to start")
        assert row.deadline is not None
        pid = int(row.worker.rpartition(":")[2])
        assert pid in {p.pid for p in children(worker)}

        def reaped() -> Any:
            run_job("reap_stuck_jobs")  # what beat runs every few seconds
            row = job(hung.id)
            return row if row.status != "running" else None

        row = wait_until(reaped, 60, "the reaper to end the job", interval=0.5)
        assert (row.status, row.error_code, row.attempts) == ("failed", "timeout", 1), row.error_message
        assert usage_events(hung.id) == ["release", "reserve"]
        # The reaper ended it, not the child's alarm (which says "hard time limit of 4 s"): the
        # task was still stuck in native code when its job ended.
        assert row.error_message == "The job ran past its time limit and was stopped."
        # The watchdog ends the stuck child; its heartbeat goes, a fresh child serves.
        wait_until(lambda: pid not in {p.pid for p in children(worker)}, 60, "the stuck child to end")
        assert not [b for b in stack.heartbeats() if b.get("pid") == pid]
        ok = submit(org, SHORT)
        (done,) = wait_status([ok.id], timeout=90)
        assert done.status == "succeeded" and done.metrics["pid"] != pid
        assert job(hung.id).attempts == 1  # the ended child's message came back to an ended job
    finally:
        stack.stop_service(worker)


def test_a_job_whose_progress_stalls_ends_timeout(stack: TestStack, builtin_voices: list[str]) -> None:
    from django.db import connection

    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    org = make_org("stall")
    j = submit(org, SHORT)
    claimed = lifecycle.claim_job(j.id, "node-s:ns-1:11")
    assert claimed is not None
    assert lifecycle.report_progress(j.id, claimed.claim_token, 1, 3) == lifecycle.Verdict.GO
    with override_settings(TTS_JOB_STALL_SECONDS=60):
        assert lifecycle.reap_running()["timeout"] == 0  # advancing: left alone, whatever the lease
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {SynthesisJob._meta.db_table} "
                "SET progress_at = now() - interval '61 seconds' WHERE id = %s",
                [str(j.id)],
            )
        assert lifecycle.reap_running()["timeout"] == 1
    row = job(j.id)
    assert (row.status, row.error_code) == ("failed", "timeout")
    assert "60 s" in row.error_message
    assert usage_events(j.id) == ["release", "reserve"]
    assert lifecycle.report_progress(j.id, claimed.claim_token, 2, 3) == lifecycle.Verdict.LOST


def test_a_job_slowed_by_a_busy_host_but_advancing_is_not_stopped_by_its_soft_limit(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "w-busy", engines="piper")
    try:
        org = make_org("busy")
        # What the work costs on this machine, unpaused (4-8 s of CPU on a quick one, three
        # times that on a slow one): the soft limit is set well above it. Twice LONG: with LONG
        # alone a quick host finished the job within its first five pauses, short of the budget.
        text = f"{LONG} {LONG}"
        (alone,) = wait_status([submit(org, text, voice=PIPER).id], timeout=90)
        assert alone.status == "succeeded", (alone.error_code, alone.error_message)
        budget = max(10.0, 2 * alone.metrics["cpu_ms"] / 1000)
        # The wall-clock ceiling (soft x TTS_JOB_WALL_FACTOR + grace) is far above the soft limit.
        with override_settings(TTS_JOB_BASE_SECONDS=budget, TTS_JOB_SECONDS_PER_CHAR=0.0):
            slow = submit(org, text, voice=PIPER)
        # The host is "busy": the child gets no CPU for longer than the budget, and advances in between.
        paused = pause_while_running(slow.id, budget + 2, slice_seconds=2.0)
        (done,) = wait_status([slow.id], timeout=90 + 2 * budget)
        assert done.status == "succeeded", (done.error_code, done.error_message)
        assert paused > budget  # the test did what it says: paused the run past its budget
        wall = (done.finished_at - done.started_at).total_seconds()
        assert wall > budget, wall
        assert done.metrics["cpu_ms"] < budget * 1000
        assert done.attempts == 1
    finally:
        stack.stop_service(worker)
