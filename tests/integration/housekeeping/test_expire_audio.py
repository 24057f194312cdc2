"""expire_audio: audio past retention goes, the job is marked expired, storage is released."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.integration.housekeeping.conftest import Clock, write_file
from webapp.housekeeping import synthesis
from webapp.housekeeping.catalog import run_job
from webapp.housekeeping.models import HousekeepingRun
from webapp.speech import lifecycle
from webapp.speech.models import SynthesisJob
from webapp.speech.services import ledger

DAY = dt.timedelta(days=1)


def test_expired_audio_is_removed_and_marked_while_fresh_audio_stays(
    clock: Clock, media: Path, make_audio_job: Any, org: Any, lock_free: None
) -> None:
    old = [make_audio_job(clock.now - dt.timedelta(hours=h), size=1000 * h) for h in (1, 2, 3)]
    fresh = make_audio_job(clock.now + DAY, size=500)
    assert ledger.storage_used(org) == 6500

    result = run_job("expire_audio", batch=2)  # two batches

    assert result.counts == {"expired": 3, "bytes_released": 6000}
    for job in old:
        job.refresh_from_db()
        assert job.status == SynthesisJob.Status.EXPIRED
        assert (job.audio_path, job.audio_bytes) == ("", 0)
    assert not any((media / f"audio/{org.id}/{job.id}.wav").exists() for job in old)
    fresh.refresh_from_db()
    assert fresh.status == SynthesisJob.Status.SUCCEEDED
    assert (media / fresh.audio_path).stat().st_size == 500
    assert ledger.storage_used(org) == 500  # storage released

    # Idempotent: nothing left to do until the fresh one's time comes.
    assert run_job("expire_audio").counts == {}
    clock.advance(DAY.total_seconds() + 1)
    assert run_job("expire_audio").counts == {"expired": 1, "bytes_released": 500}
    assert ledger.storage_used(org) == 0
    # Runs that did something are recorded; the idle one in between is only logged.
    runs = HousekeepingRun.objects.filter(job="expire_audio").order_by("started_at")
    assert [r.counts["expired"] for r in runs] == [3, 1]


@pytest.mark.parametrize("finish", ["before_row_is_reached", "while_row_is_reached"])
def test_a_job_that_finishes_while_cleanup_runs_is_not_expired(
    transactional_db: None,
    clock: Clock,
    media: Path,
    make_audio_job: Any,
    org: Any,
    voice: Any,
    lock_free: None,
    monkeypatch: pytest.MonkeyPatch,
    finish: str,
) -> None:
    old = make_audio_job(clock.now - DAY)
    job = lifecycle.submit_job(
        org,
        lifecycle.JobRequest(
            text="Hi there.", voice=voice, format="wav", sample_rate=None, params={}, billable_chars=9
        ),
    )[0]
    claimed = lifecycle.claim_job(job.id, "worker-1")
    assert claimed is not None
    # Worst case for the cleanup: its listing is stale and names the running job
    # too (a read taken just as the job finished, with an expiry in the past).
    listings = iter([[old.id, job.id]])
    monkeypatch.setattr(synthesis, "expired_job_ids", lambda now, limit: next(listings, []))

    relative = f"audio/{org.id}/{job.id}.wav"
    locked, go, done = threading.Event(), threading.Event(), threading.Event()

    real_settle = ledger.settle_completion

    def charge_then_hold(job_id: Any, *args: Any, **kwargs: Any) -> Any:
        charged = real_settle(job_id, *args, **kwargs)
        locked.set()
        go.wait(10)  # the row stays locked, uncommitted, until the cleanup reaches it
        return charged

    def worker_finishes() -> None:
        # What the worker does at the end of a job: rename the audio into place,
        # then complete_job (row lock, succeeded, fresh expires_at, charge), whose
        # transaction is held open at its last step.
        try:
            write_file(media / relative, 2222)
            monkeypatch.setattr(ledger, "settle_completion", charge_then_hold)
            assert lifecycle.complete_job(
                job.id,
                claimed.claim_token,
                audio_path=relative,
                audio_bytes=2222,
                duration_seconds=1.0,
                metrics={},
                applied_instructions={},
            )
        finally:
            done.set()
            connection.close()

    real_expire = lifecycle.expire_audio
    reached: list[Any] = []

    def expire_during_finish(job_id: Any) -> int:
        reached.append(job_id)
        if job_id == job.id:
            worker = threading.Thread(target=worker_finishes)
            worker.start()
            assert locked.wait(10)
            if finish == "before_row_is_reached":
                go.set()
                assert done.wait(10)
            else:
                threading.Timer(0.5, go.set).start()
        return real_expire(job_id)

    monkeypatch.setattr(lifecycle, "expire_audio", expire_during_finish)
    result = run_job("expire_audio")
    assert done.wait(10)

    assert reached == [old.id, job.id]
    assert result.counts["expired"] == 1
    old.refresh_from_db()
    job.refresh_from_db()
    assert old.status == SynthesisJob.Status.EXPIRED
    assert job.status == SynthesisJob.Status.SUCCEEDED
    assert job.expires_at is not None and job.expires_at > clock.now
    assert (job.audio_path, job.audio_bytes) == (relative, 2222)
    assert (media / relative).stat().st_size == 2222
    assert ledger.storage_used(org) == 2222
