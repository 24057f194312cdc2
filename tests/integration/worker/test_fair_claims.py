"""Fair claims: a message wakes a worker, which takes the queued job whose tenant runs the fewest.

One tenant's burst of long jobs must not hold every worker while another
tenant's one-sentence job waits at the end of the engine's queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest

from tests.reliability.helpers import (
    LONG,
    PIPER,
    SHORT,
    flush_queues,
    job,
    make_org,
    start_worker,
    submit,
    wait_until,
)
from tests.stack import TestStack

if TYPE_CHECKING:
    from webapp.speech.models import SynthesisJob

pytestmark = pytest.mark.django_db(transaction=True)


def test_tenant_b_starts_before_tenant_a_third_queued_job(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import lifecycle

    flush_queues(stack, "synth.piper")
    a, b = make_org("fair-a"), make_org("fair-b")
    burst = [submit(a, f"{LONG} Job {i}.", voice=PIPER) for i in range(20)]
    late = submit(b, SHORT, voice=PIPER)  # its message is the 21st in the queue
    worker = start_worker(stack, "w-fair", engines="piper", concurrency=2)
    try:
        started = wait_until(lambda: job(late.id).started_at, 120, "tenant B's job to start")
        third = job(burst[2].id)
        assert third.started_at is None or started < third.started_at, (started, third.started_at)
    finally:
        for queued in burst:
            if job(queued.id).status == "queued":
                lifecycle.cancel_job(queued)
        stack.stop_service(worker)


def test_claims_go_to_the_tenant_running_the_fewest_then_the_oldest(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import lifecycle

    a, b = make_org("fair-a2"), make_org("fair-b2")
    burst = [submit(a, f"{SHORT} {i}.", voice=PIPER) for i in range(3)]
    late = submit(b, SHORT, voice=PIPER)
    # Four queued jobs, four claims: each finds one (a None fails the comparisons below).
    order = [cast("SynthesisJob", lifecycle.claim_next("piper", f"node:ns-1:{n}")) for n in range(4)]
    assert [j.id for j in order] == [burst[0].id, late.id, burst[1].id, burst[2].id]
    assert [j.attempts for j in order] == [1, 1, 1, 1]
    assert lifecycle.claim_next("piper", "node:ns-1:9") is None
    flush_queues(stack, "synth.piper")
