"""Fair claims: a message wakes a worker, which takes interactive work first, then the queued job
whose tenant runs the fewest.

One tenant's burst of long jobs must not hold every worker while another
tenant's one-sentence job waits at the end of the engine's queue.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import pytest

from tests.integration.api.session_client import Received as Got
from tests.integration.api.session_client import open_session, read_until, send
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


def test_an_interactive_job_is_claimed_before_the_same_tenants_older_batch_jobs(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from webapp.speech import lifecycle

    a, b = make_org("lane-a"), make_org("lane-b")
    batch = [submit(a, f"{SHORT} {i}.", voice=PIPER) for i in range(2)]
    other = submit(b, SHORT, voice=PIPER)
    waited = submit(a, SHORT, voice=PIPER, lane="interactive")  # newest, of the busier tenant
    order = [cast("SynthesisJob", lifecycle.claim_next("piper", f"node:ns-1:{n}")) for n in range(4)]
    # Interactive first; then fairness and age as before among the batch jobs.
    assert [j.id for j in order] == [waited.id, other.id, batch[0].id, batch[1].id]
    assert [j.lane for j in order] == ["interactive", "batch", "batch", "batch"]
    flush_queues(stack, "synth.piper")


def test_a_waiting_clients_job_starts_next_on_a_worker_busy_with_batch_work(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    """One child, one tenant: its 6 batch jobs are queued when its interactive job comes; the
    interactive one runs as soon as the child is free, not after the batch jobs queued before it."""
    from webapp.speech import lifecycle

    flush_queues(stack, "synth.piper")
    org = make_org("lane-busy")
    batch = [submit(org, f"{LONG} Job {i}.", voice=PIPER) for i in range(6)]  # about 2 s each
    worker = start_worker(stack, "w-lanes", engines="piper", concurrency=1)
    try:
        wait_until(lambda: job(batch[0].id).started_at, 120, "the first batch job to start")
        waited = submit(org, SHORT, voice=PIPER, lane="interactive")
        started = wait_until(lambda: job(waited.id).started_at, 120, "the interactive job to start")
        later = [job(queued.id).started_at for queued in batch[2:]]
        assert all(s is None or started < s for s in later), (started, later)
    finally:
        for queued in batch:
            if job(queued.id).status == "queued":
                lifecycle.cancel_job(queued)
        stack.stop_service(worker)


@pytest.mark.usefixtures("no_session_worker")
def test_a_reserved_child_starts_interactive_work_at_once_and_batch_work_keeps_flowing(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    """Two children, one job slot reserved (the default): tenant B's interactive job starts within 2 s of its submit while
    A's batch job still runs, and A's batch jobs run one at a time, all of them (none is left
    without a message)."""
    from webapp.speech import lifecycle
    from webapp.speech.services import eta

    flush_queues(stack, "synth.piper")
    a, b = make_org("lane-reserved-a"), make_org("lane-reserved-b")
    batch = [submit(a, f"{LONG} {LONG} {LONG} Job {i}.", voice=PIPER) for i in range(3)]  # about 6 s each
    worker = start_worker(
        stack, "w-reserved", engines="piper", concurrency=2
    )  # default settings: one reserved
    try:
        wait_until(lambda: sum(eta.serving_children("piper").values()) == 2, 30, "two children serving")
        first = wait_until(lambda: job(batch[0].id).started_at, 120, "the first batch job to start")
        waited = submit(b, SHORT, voice=PIPER, lane="interactive")
        started = wait_until(lambda: job(waited.id).started_at, 60, "the interactive job to start")
        # The free child took it at once (unreserved, it waits seconds for a batch job to end).
        assert (started - waited.created_at).total_seconds() < 2.0, (waited.created_at, started)
        running_batch = job(batch[0].id)
        assert running_batch.finished_at is None or started < running_batch.finished_at, (
            first,
            started,
            running_batch.finished_at,
        )
        wait_until(
            lambda: all(job(j.id).status == "succeeded" for j in batch), 180, "every batch job to succeed"
        )
        spans = sorted((job(j.id).started_at, job(j.id).finished_at) for j in batch)
        # One batch job at a time: each started after the one before it ended.
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans
    finally:
        for queued in batch:
            if job(queued.id).status == "queued":
                lifecycle.cancel_job(queued)
        stack.stop_service(worker)


@pytest.mark.usefixtures("no_session_worker")
def test_a_tenants_100_queued_batch_jobs_do_not_delay_another_tenants_session_unit(
    stack: TestStack, builtin_voices: list[str], web: Any
) -> None:
    """Default worker settings (two children, one job slot kept free of batch work): tenant B's
    realtime session hears its first unit's audio within 2 s, through Nginx and TLS, while tenant
    A's 100 batch jobs of about 6 s each wait; unreserved, it would wait for a batch job to end."""
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import eta
    from webapp.tenants.services import OPERATOR, create_api_key

    flush_queues(stack, "synth.piper")
    a, b = make_org("lane-backlog-a"), make_org("lane-backlog-b")
    _, raw_key = create_api_key(b, "agent", created_by=OPERATOR, scopes=["speech:write", "speech:read"])
    backlog = [submit(a, f"{LONG} {LONG} {LONG} Chapter {i}.", voice=PIPER) for i in range(100)]
    worker = start_worker(stack, "w-backlog", engines="piper", concurrency=2)
    try:
        wait_until(lambda: sum(eta.serving_children("piper").values()) == 2, 30, "two children serving")
        wait_until(lambda: job(backlog[0].id).started_at, 120, "the backlog to start")
        with open_session(int(web.cfg.https_port), raw_key) as ws:
            send(ws, {"type": "session.config", "voice": PIPER, "response_format": "pcm"})
            got = read_until(ws, Got(), lambda g: g.of("session.ready"))
            sent = time.monotonic()
            send(ws, {"type": "input.text", "text": "Your order ships tomorrow morning.", "flush": True})
            got = read_until(ws, got, lambda g: len(g.frames) > 0, timeout=60)
            first_audio = got.frames[0][0] - sent
        waiting = SynthesisJob.objects.filter(id__in=[j.id for j in backlog], status="queued").count()
        assert waiting >= 90, waiting  # the backlog was there all along
        assert first_audio < 2.0, first_audio
    finally:
        for queued in backlog:
            if job(queued.id).status == "queued":
                lifecycle.cancel_job(queued)
        stack.stop_service(worker)
