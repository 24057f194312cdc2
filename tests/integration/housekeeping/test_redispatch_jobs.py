"""redispatch_jobs: a queued job whose message was never sent is sent (it reaches Redis) once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.integration.housekeeping.conftest import Clock, submit
from tests.stack import TestStack as Stack
from webapp.housekeeping.catalog import run_job
from webapp.speech.models import SynthesisJob


def test_an_undispatched_job_is_sent_once(
    clock: Clock, stack: Stack, probe_queue: str, media: Path, org: Any, voice: Any, lock_free: None
) -> None:
    r = stack.redis_client()
    job = submit(org, voice)  # a `db` test never commits, so submit's own dispatch never ran
    assert SynthesisJob.objects.get(id=job.id).dispatched_at is None

    # Within the grace period the submit may still be sending it: left alone.
    assert run_job("redispatch_jobs").counts == {"dispatched": 0, "still_undispatched": 0}
    assert r.llen(probe_queue) == 0

    clock.advance(settings.TTS_DISPATCH_GRACE_SECONDS + 1)
    assert run_job("redispatch_jobs").counts == {"dispatched": 1, "still_undispatched": 0}
    assert r.llen(probe_queue) == 1
    assert str(job.id) in str(r.lindex(probe_queue, 0))
    assert SynthesisJob.objects.get(id=job.id).dispatched_at == clock.now

    assert run_job("redispatch_jobs").counts["dispatched"] == 0  # sent once
    assert r.llen(probe_queue) == 1


def test_a_broker_outage_leaves_the_job_for_the_next_run(
    clock: Clock,
    settings: Any,
    probe_queue: str,
    stack: Stack,
    org: Any,
    voice: Any,
    lock_free: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from webapp.celery import app

    job = submit(org, voice)
    clock.advance(settings.TTS_DISPATCH_GRACE_SECONDS + 1)

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError(111, "Connection refused")  # the injected fault

    with monkeypatch.context() as patch:
        patch.setattr(app, "send_task", broker_down)  # how dispatch sends: by task name
        assert run_job("redispatch_jobs").counts == {"dispatched": 0, "still_undispatched": 1}
    assert SynthesisJob.objects.get(id=job.id).dispatched_at is None
    assert run_job("redispatch_jobs").counts == {"dispatched": 1, "still_undispatched": 0}
    assert stack.redis_client().llen(probe_queue) == 1


def test_a_job_claimed_before_its_own_dispatch_still_sends_a_wake_up(
    stack: Stack, probe_queue: str, media: Path, org: Any, voice: Any, lock_free: None
) -> None:
    """The race seen under a burst of submits: messages claim the fairest (oldest) job.

    The later job's message went out first and its worker claimed the older job;
    when the older job's own dispatch runs, its message is the only one left for
    the later job, which would otherwise wait for the lost-delivery sweep.
    """
    from webapp.speech import lifecycle
    from webapp.speech.services import dispatch

    r = stack.redis_client()
    older, later = submit(org, voice), submit(org, voice)
    claimed = lifecycle.claim_next(voice.engine, "node:ns-1:1")
    assert claimed is not None and claimed.id == older.id  # taken by the later job's message

    assert dispatch.dispatch_job(older.id) is True
    assert r.llen(probe_queue) == 1
    woken = lifecycle.claim_next(voice.engine, "node:ns-1:2")  # what that message's worker does
    assert woken is not None and woken.id == later.id
