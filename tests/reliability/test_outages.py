"""Redis and PostgreSQL go away and come back: nothing queued is lost, the API says 503 meanwhile.

Each outage overlaps work: jobs waiting in the broker, or a job mid-synthesis
(its attempt began before the outage and ended after it). Redis is stopped
both ways: SIGTERM (it writes its AOF out, nothing is lost) and SIGKILL with
the last writes gone from the AOF, as a host crash leaves it under
``appendfsync everysec``: there the messages are really lost and the
lost-delivery sweep must bring them back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.reliability.helpers import (
    LONG,
    PIPER,
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
from tests.stack import CFG, TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def _service(stack: TestStack, name: str) -> Service:
    return next(s for s in stack.sup.services if s.name == name)


@contextlib.contextmanager
def redis_down(stack: TestStack) -> Iterator[None]:
    # SIGTERM: Redis writes its AOF out and exits, as on a normal restart.
    stack.stop_service(_service(stack, "redis"))
    try:
        yield
    finally:
        stack.start_service(Service("redis", deploy_stack.redis_command(CFG), ready_port=CFG.redis_port))


def _incr_aof() -> Path:
    """Redis 7's current incremental AOF file (appendonlydir/<name>.<seq>.incr.aof)."""
    files = CFG.path("redis", "appendonlydir").glob("*.incr.aof")
    return max(files, key=lambda p: int(p.name.split(".")[-3]))


@contextlib.contextmanager
def redis_killed(stack: TestStack, aof: Path, keep_bytes: int) -> Iterator[None]:
    """SIGKILL (no shutdown, no last AOF write), and the AOF cut back to ``keep_bytes``.

    On one host a killed Redis keeps what it had written (the kernel has it);
    a crash of the host loses up to the last second that ``everysec`` had not
    synced yet. Cutting the file is that crash, chosen to lose exactly the
    writes the test names.
    """
    stack.stop_service(_service(stack, "redis"), sig=signal.SIGKILL)
    os.truncate(aof, keep_bytes)
    try:
        yield
    finally:
        stack.start_service(Service("redis", deploy_stack.redis_command(CFG), ready_port=CFG.redis_port))


@contextlib.contextmanager
def postgres_down(stack: TestStack) -> Iterator[None]:
    from django.db import connections

    connections.close_all()
    stack.stop_service(_service(stack, "postgres"), sig=signal.SIGINT)
    try:
        yield
    finally:
        cmd, kwargs = deploy_stack.postgres_command(CFG)
        stack.start_service(
            Service("postgres", cmd, popen_kwargs=kwargs, ready_port=CFG.pg_port, stop_signal=signal.SIGINT)
        )
        wait_until(_db_answers, 30, "PostgreSQL to accept connections")


def _db_answers() -> bool:
    from django.db import connection

    try:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        return False


def _api_key(org: object) -> str:
    from webapp.tenants.services import OPERATOR, create_api_key

    return create_api_key(org, "outage", created_by=OPERATOR)[1]  # type: ignore[arg-type]


def _submit_problem(client: Client, key: str) -> tuple[int, str, str | None]:
    """A submit through the API while a backing service is down: (status, content type, Retry-After)."""
    response = client.post(
        "/api/v1/speech",
        data={"text": "Hello.", "voice": "espeak-en-us"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    return response.status_code, response.get("Content-Type", ""), response.get("Retry-After")


def test_redis_stopped_with_jobs_queued_then_started(stack: TestStack, builtin_voices: list[str]) -> None:
    from webapp.speech.services import dispatch

    flush_queues(stack, "synth.piper")
    org = make_org("redis-out")
    key = _api_key(org)
    # No worker yet: the jobs wait in Redis, which is then stopped.
    queued = [submit(org, f"{SHORT} Queued {i}.", voice=PIPER) for i in range(3)]
    assert all(job(j.id).dispatched_at is not None for j in queued)
    assert stack.redis_client().llen("synth.piper") == 3
    client = Client()
    with redis_down(stack):
        health = client.get("/healthz")
        assert health.status_code == 503 and health["Retry-After"]
        assert health.json()["checks"]["redis"] == "fail"
        status, content_type, retry_after = _submit_problem(client, key)
        assert status == 503 and content_type.startswith("application/problem+json") and retry_after
        # A job created while the broker is down stays undispatched (the row is the outbox).
        late = submit(org, f"{SHORT} Submitted during the outage.", voice=PIPER)
        assert job(late.id).dispatched_at is None
    # Beat's re-dispatch (called directly here) sends what could not be sent.
    assert dispatch.redispatch_undispatched(older_than_seconds=0) == 1
    assert stack.redis_client().llen("synth.piper") == 4  # the three from before the restart survived
    worker = start_worker(stack, "w-redis", engines="piper")
    try:
        rows = wait_status([j.id for j in [*queued, late]], timeout=60)
        assert [r.status for r in rows] == ["succeeded"] * 4
        assert all(r.attempts == 1 and usage_events(r.id) == ["charge", "reserve"] for r in rows)
        # The worker rides out a Redis restart too, mid-job: one attempt that began
        # before Redis stopped and ended after, charged once.
        running = submit(org, " ".join([LONG] * 3), voice=PIPER)
        wait_until(lambda: 0 < job(running.id).progress < 0.5, 30, "the job mid-synthesis", 0.02)
        outage = timezone.now()
        with redis_down(stack):
            time.sleep(2)
        (row,) = wait_status([running.id], timeout=90)
        assert row.status == "succeeded" and usage_events(row.id) == ["charge", "reserve"]
        assert row.started_at < outage < row.finished_at
        # One claim, and the attempt that finished is that claim's.
        assert row.attempts == 1 and row.metrics["claim_token"] == row.claim_token
        after = submit(org, SHORT, voice=PIPER)
        (row,) = wait_status([after.id], timeout=60)
        assert row.status == "succeeded"
    finally:
        stack.stop_service(worker)


def test_redis_killed_loses_its_last_writes_and_every_job_still_runs(
    stack: TestStack, builtin_voices: list[str], settings: Any
) -> None:
    from webapp.housekeeping import synthesis

    flush_queues(stack, "synth.piper")
    org = make_org("redis-kill")
    aof = _incr_aof()
    keep = aof.stat().st_size
    # No worker yet: the three messages wait in Redis, written to its AOF, then lost with it.
    queued = [submit(org, f"{SHORT} Lost {i}.", voice=PIPER) for i in range(3)]
    assert stack.redis_client().llen("synth.piper") == 3 and aof.stat().st_size > keep
    with redis_killed(stack, aof, keep):
        pass
    # The loss is real: the broker has no message, the rows still say queued and dispatched.
    assert stack.redis_client().llen("synth.piper") == 0
    assert all(job(j.id).status == "queued" and job(j.id).dispatched_at is not None for j in queued)
    # The lost-delivery sweep (beat's, called here at once) sends what the queue lacks.
    settings.TTS_JOB_REDELIVER_SECONDS = 0
    assert synthesis.resend_lost_deliveries() == (3, 0)
    assert stack.redis_client().llen("synth.piper") == 3
    worker = start_worker(stack, "w-redis-kill", engines="piper")
    try:
        rows = wait_status([j.id for j in queued], timeout=60)
        assert [r.status for r in rows] == ["succeeded"] * 3
        assert all(r.attempts == 1 and usage_events(r.id) == ["charge", "reserve"] for r in rows)
    finally:
        stack.stop_service(worker)


def test_postgres_stopped_worker_retries_and_nothing_is_lost(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "w-pg", engines="piper")
    try:
        org = make_org("pg-out")
        key = _api_key(org)
        jobs = [
            # 20 sentences: still running when PostgreSQL stops, just after the second began.
            submit(org, " ".join([LONG] * 2), voice=PIPER),
            submit(org, SHORT, voice=PIPER),
            submit(org, SHORT, voice=PIPER),
        ]
        wait_until(
            lambda: job(jobs[0].id).stage.startswith("synthesising 2/"), 60, "the first job mid-synthesis"
        )
        before = job(jobs[0].id)
        client = Client()
        outage_began = timezone.now()
        with postgres_down(stack):
            time.sleep(3)  # the worker hits the outage mid-job and keeps retrying
            health = client.get("/healthz")
            assert health.status_code == 503 and health.json()["checks"]["db"] == "fail"
            status, content_type, retry_after = _submit_problem(client, key)
            assert status == 503 and content_type.startswith("application/problem+json") and retry_after
            assert worker.process is not None and worker.process.poll() is None
        outage_ended = timezone.now()
        rows = wait_status([j.id for j in jobs], timeout=180)
        assert [r.status for r in rows] == ["succeeded"] * 3, [(r.status, r.error_code) for r in rows]
        assert all(usage_events(r.id) == ["charge", "reserve"] for r in rows)
        # The outage overlapped the first job: one attempt, begun before it, ended after it.
        assert before.status == "running" and before.progress < 1.0, (before.status, before.progress)
        first = rows[0]
        assert first.started_at < outage_began and first.finished_at > outage_ended
        assert first.attempts == 1 and first.metrics["claim_token"] == first.claim_token
    finally:
        stack.stop_service(worker)


def test_a_read_cut_off_by_a_database_restart_requeues_the_job_not_fails_it(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    """A read of the run with no retry of its own (the plan's cache bound) met the restart: the
    job was failed ``synthesis_failed``, once in a CI soak. It is re-queued, then succeeds."""
    from webapp.speech.models import SynthesisJob

    flush_queues(stack, "synth.espeak")
    marker = "#db-gone#"
    worker = start_worker(stack, "w-db-gone", TTS_FAULT_DB_GONE_MARKER=marker)
    try:
        org = make_org("db-gone")
        hit = submit(org, f"This text {marker} meets a database restart.")
        (row,) = wait_status([hit.id], timeout=60)
        assert row.status == "succeeded", (row.error_code, row.error_message)
        assert row.attempts == 2  # the first met the fault (first attempts only)
        assert usage_events(row.id) == ["charge", "reserve"]
        assert SynthesisJob.objects.filter(organization=org, status="failed").count() == 0
    finally:
        stack.stop_service(worker)
