"""Time limits follow the row: a hung job ends `timeout` after one attempt; a stalled one too."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.reliability.helpers import (
    SHORT,
    flush_queues,
    job,
    make_org,
    start_worker,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_that_sleeps_past_the_hard_limit_ends_timeout_after_one_attempt(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.housekeeping.jobs import run_job

    flush_queues(stack, "synth.espeak")
    marker = "#hang#"
    worker = start_worker(stack, "w-hang", TTS_FAULT_HANG_MARKER=marker)
    try:
        org = make_org("hang")
        # Soft 1 s, hard 2 s: sent with the message and written on the row as its deadline.
        with override_settings(
            TTS_JOB_BASE_SECONDS=1.0, TTS_JOB_SECONDS_PER_CHAR=0.0, TTS_JOB_HARD_GRACE_SECONDS=1
        ):
            hung = submit(org, f"This text {marker} never finishes.")
        wait_until(lambda: job(hung.id).status == "running", 30, "the job to start")
        assert job(hung.id).deadline is not None

        def reaped() -> Any:
            run_job("reap_stuck_jobs")  # what beat runs every few seconds
            row = job(hung.id)
            return row if row.status != "running" else None

        row = wait_until(reaped, 30, "the reaper to end the job", interval=0.5)
        assert (row.status, row.error_code, row.attempts) == ("failed", "timeout", 1), row.error_message
        assert usage_events(hung.id) == ["release", "reserve"]
        # The worker serves on.
        ok = submit(org, SHORT)
        (done,) = wait_status([ok.id], timeout=60)
        assert done.status == "succeeded"
        assert job(hung.id).attempts == 1  # the killed run's message did not come back
    finally:
        stack.stop_service(worker)


def test_a_job_whose_progress_stalls_ends_timeout(stack: TestStack, builtin_voices: list[str]) -> None:
    from django.db import connection

    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import attempts

    org = make_org("stall")
    j = submit(org, SHORT)
    claimed = attempts.claim_job(j.id, "node-s:ns-1:11")
    assert claimed is not None
    assert attempts.report_progress(j.id, claimed.claim_token, 1, 3) == attempts.Verdict.GO
    with override_settings(TTS_JOB_STALL_SECONDS=60):
        assert attempts.reap_running()["timeout"] == 0  # advancing: left alone, whatever the lease
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {SynthesisJob._meta.db_table} "
                "SET progress_at = now() - interval '61 seconds' WHERE id = %s",
                [str(j.id)],
            )
        assert attempts.reap_running()["timeout"] == 1
    row = job(j.id)
    assert (row.status, row.error_code) == ("failed", "timeout")
    assert "60 s" in row.error_message
    assert usage_events(j.id) == ["release", "reserve"]
    assert attempts.report_progress(j.id, claimed.claim_token, 2, 3) == attempts.Verdict.LOST
