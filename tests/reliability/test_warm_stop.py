"""Stopping the stack (Ctrl-C, `make stop`) lets a running job finish instead of cutting it off."""

from __future__ import annotations

import time

import pytest

from deploy import stack as deploy_stack
from tests.reliability.helpers import (
    LONG,
    PIPER,
    flush_queues,
    job,
    make_org,
    submit,
    usage_events,
    wait_until,
)
from tests.stack import CFG, TestStack

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_stopping_the_stack_during_a_long_job_does_not_cost_it_an_attempt(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    org = make_org("warm-stop")
    # The worker exactly as `make run` runs it, stopped by the supervisor's own stop path.
    service = deploy_stack.worker_service(CFG, "warm-stop")
    service.env.update(
        {
            "TTS_WORKER_ENGINES": "piper",
            "TTS_WORKER_CONCURRENCY": "1",
            "TTS_HEARTBEAT_INTERVAL": "0.5",
            "TTS_HEARTBEAT_TTL": "3",
            "TTS_WORKER_STOP_GRACE": "10",
        }
    )
    service.command = deploy_stack.worker_command(CFG, queues="synth.piper", name="warm-stop")
    stack.start_service(service)
    try:
        stack.wait_for_workers(service, 1, 120)
        # About 240 s of audio: 10-20 s of synthesis on two busy cores, about the grace period.
        long_job = submit(org, " ".join([LONG] * 6), voice=PIPER)
        wait_until(lambda: job(long_job.id).status == "running", 60, "the job to start")
        time.sleep(2)
        stack.sup.stop(service, timeout=10 + deploy_stack.WORKER_STOP_MARGIN_SECONDS)
    finally:
        stack.stop_service(service)
    row = job(long_job.id)
    # Either it finished within the grace period, or the worker handed it back untouched.
    assert (row.status, row.attempts) in (("succeeded", 1), ("queued", 0)), (
        row.status,
        row.attempts,
        row.error_code,
    )
    if row.status == "succeeded":
        assert usage_events(long_job.id) == ["charge", "reserve"]
