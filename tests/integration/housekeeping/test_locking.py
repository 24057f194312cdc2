"""Every job runs under a Redis lock: overlapping runs do the work once; failures free the lock."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection

from tests.integration.housekeeping.conftest import Clock
from tests.stack import TestStack as Stack
from webapp.housekeeping import jobs, locks
from webapp.housekeeping.catalog import RunResult, run_job
from webapp.housekeeping.models import HousekeepingRun
from webapp.speech import lifecycle
from webapp.speech.models import SynthesisJob


def test_two_overlapping_runs_do_the_work_once(
    transactional_db: None,
    clock: Clock,
    media: Path,
    make_audio_job: Any,
    lock_free: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expired = [make_audio_job(clock.now - dt.timedelta(hours=1)) for _ in range(3)]
    inside, finish = threading.Event(), threading.Event()
    real_expire = lifecycle.expire_audio

    def slow_expire(job_id: Any) -> int:
        inside.set()
        assert finish.wait(10)  # the first run stays inside its batch while the second starts
        return real_expire(job_id)

    monkeypatch.setattr(lifecycle, "expire_audio", slow_expire)
    results: dict[str, RunResult] = {}

    def run(name: str) -> None:
        try:
            results[name] = run_job("expire_audio")
        finally:
            connection.close()

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    second.join(10)
    assert results["second"].skipped  # it did not wait for, nor repeat, the first run's work
    finish.set()
    first.join(10)

    assert not results["first"].skipped
    assert results["first"].counts["expired"] == 3
    assert SynthesisJob.objects.filter(id__in=[j.id for j in expired], status="expired").count() == 3
    assert HousekeepingRun.objects.filter(job="expire_audio").count() == 1  # one run recorded


def test_a_held_lock_makes_a_run_skip_and_its_release_lets_the_next_run_work(
    stack: Stack, clock: Clock, media: Path, make_audio_job: Any, lock_free: None
) -> None:
    job = make_audio_job(clock.now - dt.timedelta(hours=1))
    holder = locks.RedisLock("expire_audio", 60)
    assert holder.acquire()
    r = stack.redis_client()
    assert 0 < r.ttl(locks.KEY_PREFIX + "expire_audio") <= 60  # it always expires
    try:
        assert run_job("expire_audio").skipped
        job.refresh_from_db()
        assert job.status == SynthesisJob.Status.SUCCEEDED
        # Only the holder's token releases it.
        assert not locks.RedisLock("expire_audio", 60).release()
        intruder = locks.RedisLock("expire_audio", 60)
        intruder.held = True
        assert not intruder.release()
        assert r.exists(locks.KEY_PREFIX + "expire_audio")
    finally:
        assert holder.release()
    assert run_job("expire_audio").counts["expired"] == 1


def test_a_failed_or_interrupted_run_is_recorded_and_frees_its_lock(
    stack: Stack, isolated: None, lock_free: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(ctx: jobs.Context) -> None:
        ctx.add("before_failure")
        raise RuntimeError("disk on fire")

    def interrupted(ctx: jobs.Context) -> None:
        ctx.add("done_before_limit", 7)
        raise SoftTimeLimitExceeded()

    monkeypatch.setitem(jobs.JOBS, "expire_audio", jobs.Job("expire_audio", boom, "test"))
    with pytest.raises(RuntimeError, match="disk on fire"):
        run_job("expire_audio")
    monkeypatch.setitem(jobs.JOBS, "expire_audio", jobs.Job("expire_audio", interrupted, "test"))
    result = run_job("expire_audio")  # the lock was freed, so this one runs

    assert (result.outcome, result.counts) == ("partial", {"done_before_limit": 7})
    rows = list(
        HousekeepingRun.objects.filter(job="expire_audio").order_by("id").values("outcome", "error", "counts")
    )
    assert rows == [
        {"outcome": "error", "error": "RuntimeError: disk on fire", "counts": {"before_failure": 1}},
        {"outcome": "partial", "error": "soft time limit exceeded", "counts": {"done_before_limit": 7}},
    ]
    assert not stack.redis_client().exists(locks.KEY_PREFIX + "expire_audio")


def test_a_spent_time_budget_stops_between_batches(
    clock: Clock, media: Path, make_audio_job: Any, lock_free: None
) -> None:
    for _ in range(3):
        make_audio_job(clock.now - dt.timedelta(hours=1))
    result = run_job("expire_audio", budget_seconds=0)
    assert (result.outcome, result.counts) == ("partial", {})
    assert run_job("expire_audio", batch=2).counts["expired"] == 3  # the next run continues
