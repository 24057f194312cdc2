"""A message lost after dispatch costs at most T; a job queued too long ends `queue_timeout`."""

from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

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
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)

T = 3


def test_a_message_dropped_after_dispatch_runs_within_t(stack: TestStack, builtin_voices: list[str]) -> None:
    from webapp.celery import app
    from webapp.housekeeping.catalog import run_job

    flush_queues(stack, "synth.espeak")
    worker = start_worker(stack, "w-lost")
    try:
        org = make_org("lost")
        with override_settings(TTS_JOB_REDELIVER_SECONDS=T):
            # Sent, then lost between the broker and a worker (a node dying after BRPOP,
            # Redis's fsync window, a purge): the row says dispatched, no message exists.
            with mock.patch.object(app, "send_task"):  # how dispatch sends: by task name
                j = submit(org, SHORT)
            assert job(j.id).dispatched_at is not None
            dropped = time.monotonic()
            while job(j.id).status == "queued" and time.monotonic() - dropped < 3 * T:
                run_job("sweep_lost_deliveries")  # what beat runs every few seconds
                time.sleep(0.5)
        (row,) = wait_status([j.id], timeout=30)
        ran_after = (row.started_at - job(j.id).created_at).total_seconds()
        assert row.status == "succeeded" and row.attempts == 1
        assert ran_after < T + 2, ran_after
        assert usage_events(j.id) == ["charge", "reserve"]
    finally:
        stack.stop_service(worker)


def test_a_job_queued_past_the_maximum_age_ends_queue_timeout(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.housekeeping import synthesis

    flush_queues(stack, "synth.espeak")  # no worker: the job only waits
    org = make_org("stale-queue")
    j = submit(org, SHORT)
    with override_settings(TTS_JOB_MAX_QUEUE_SECONDS=1, TTS_JOB_REDELIVER_SECONDS=3600):
        assert synthesis.resend_lost_deliveries() == (0, 0)
        time.sleep(1.2)
        assert synthesis.resend_lost_deliveries() == (0, 1)
    row = job(j.id)
    assert (row.status, row.error_code) == ("failed", "queue_timeout")
    assert usage_events(j.id) == ["release", "reserve"]
    flush_queues(stack, "synth.espeak")


@pytest.mark.parametrize("queued_before", [False, True], ids=["submitted-to-a-ready-worker", "queued-before"])
def test_a_claim_whose_commit_reply_is_lost_runs_its_job_at_once(
    stack: TestStack, builtin_voices: list[str], tmp_path: Path, queued_before: bool
) -> None:
    """The claim commits and its reply never comes (the connection drops): the retried claim
    finds the job it already owns instead of leaving it "running" under a live owner, idle
    until its lease (60 s) runs out."""
    flush_queues(stack, "synth.espeak")
    marker = "#lost-reply#"
    record = tmp_path / "lost"
    org = make_org("lost-reply")
    # Queued before the worker starts (its message waits in the queue) or submitted to a ready one.
    early = submit(org, f"{SHORT} {marker}") if queued_before else None
    worker = start_worker(
        stack,
        "w-lost-reply",
        TTS_FAULT_LOST_CLAIM_REPLY_MARKER=marker,
        TTS_FAULT_LOST_CLAIM_REPLY_RECORD=str(record),
    )
    try:
        j = early or submit(org, f"{SHORT} {marker}")
        (row,) = wait_status([j.id], timeout=30)  # far below the 60 s lease
        assert row.status == "succeeded", (row.error_code, row.error_message)
        # The fault fired: the first claim committed (attempt 1, this worker's child) and its reply was lost.
        (lost,) = [line.split() for line in record.read_text().splitlines()]
        assert lost[:2] == [str(j.id), "1"]
        # That claim is the one that ran: no second claim, no second attempt.
        assert row.attempts == 1 and row.claim_token == int(lost[3])
        assert row.metrics["worker"] == lost[2]
        assert usage_events(j.id) == ["charge", "reserve"]
    finally:
        stack.stop_service(worker)
