"""reap_stuck_jobs: a running job whose lease ran out is re-queued, then failed worker_lost."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from django.conf import LazySettings
from django.db.models.functions import Now

from tests.integration.housekeeping.conftest import Clock, submit
from tests.stack import TestStack as Stack
from webapp.housekeeping.catalog import run_job
from webapp.speech import lifecycle
from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod
from webapp.speech.services import ledger

Status = SynthesisJob.Status


def lease_runs_out(job: Any) -> None:
    SynthesisJob.objects.filter(id=job.id).update(lease_until=Now() - dt.timedelta(seconds=1))


def test_a_stuck_job_is_requeued_once_then_failed_worker_lost(
    clock: Clock,
    settings: LazySettings,
    stack: Stack,
    probe_queue: str,
    media: Path,
    org: Any,
    voice: Any,
    lock_free: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.TTS_JOB_MAX_ATTEMPTS = 2
    r = stack.redis_client()
    job = submit(org, voice, "Twelve chars")
    period = ledger.period_start(clock.now)
    assert UsagePeriod.objects.get(organization=org, period=period).characters_reserved == 12
    assert lifecycle.claim_job(job.id, "worker-a") is not None  # attempt 1; then worker-a dies
    assert run_job("reap_stuck_jobs").counts == {
        "requeued": 0,
        "failed": 0,
        "sessions_closed": 0,
    }  # lease still valid

    lease_runs_out(job)  # the reaper judges leases by the database clock
    with django_capture_on_commit_callbacks(execute=True):
        assert run_job("reap_stuck_jobs").counts == {"requeued": 1, "failed": 0, "sessions_closed": 0}
    job.refresh_from_db()
    assert (job.status, job.worker, job.lease_until, job.attempts) == (Status.QUEUED, "", None, 1)
    assert job.dispatched_at is not None and r.llen(probe_queue) == 1  # sent again
    assert run_job("reap_stuck_jobs").counts == {
        "requeued": 0,
        "failed": 0,
        "sessions_closed": 0,
    }  # once only

    assert lifecycle.claim_job(job.id, "worker-b") is not None  # attempt 2; worker-b dies too
    lease_runs_out(job)  # the reaper judges leases by the database clock
    assert run_job("reap_stuck_jobs").counts == {"requeued": 0, "failed": 1, "sessions_closed": 0}
    job.refresh_from_db()
    assert (job.status, job.error_code, job.attempts) == (Status.FAILED, "worker_lost", 2)
    kinds = sorted(UsageEvent.objects.filter(job_key=job.id).values_list("kind", flat=True))
    assert kinds == ["release", "reserve"]
    usage = UsagePeriod.objects.get(organization=org, period=period)
    assert (usage.characters_reserved, usage.characters_used) == (0, 0)
    assert run_job("reap_stuck_jobs").counts == {"requeued": 0, "failed": 0, "sessions_closed": 0}


def test_a_session_whose_web_process_stopped_is_closed_once(
    clock: Clock, stack: Stack, org: Any, voice: Any, lock_free: None
) -> None:
    from webapp.speech.models import SpeechSession

    now = clock.now
    # A process that died stops renewing its sessions' rows; a live one keeps renewing.
    dead = SpeechSession.objects.create(organization=org, alive_until=now - dt.timedelta(seconds=1))
    live = SpeechSession.objects.create(organization=org, alive_until=now + dt.timedelta(seconds=30))
    unit = submit(org, voice, "A unit.")
    SynthesisJob.objects.filter(id=unit.id).update(session=dead)
    assert run_job("reap_stuck_jobs").counts["sessions_closed"] == 1
    dead.refresh_from_db()
    live.refresh_from_db()
    assert (dead.status, dead.close_code, dead.units) == ("closed", 1006, 1)
    assert dead.ended_at is not None and live.status == "open"
    assert run_job("reap_stuck_jobs").counts["sessions_closed"] == 0  # once only
