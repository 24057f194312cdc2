"""sweep_lost_deliveries in a backlog: at most one message per queued job waits in the broker.

2,000 jobs wait with no worker (the probe engine has none). Each was sent once;
the sweep, run again and again past TTS_JOB_REDELIVER_SECONDS, sends nothing
more while their messages wait, and sends back exactly the messages lost.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.integration.housekeeping.conftest import Clock
from tests.stack import TestStack as Stack
from webapp.housekeeping.catalog import run_job

BACKLOG = 2000


def _queue_backlog(org: Any, voice: Any, clock: Clock) -> list[uuid.UUID]:
    """BACKLOG queued jobs, each dispatched once (a real message in the engine's queue).

    Sent as dispatch sends them, through one producer (dispatch_job takes one from
    the pool per message: 2,000 of them would cost the test 15 s).
    """
    from webapp.celery import app
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import dispatch

    jobs = SynthesisJob.objects.bulk_create(
        SynthesisJob(
            id=uuid.uuid4(),
            organization=org,
            voice=voice,
            voice_name=voice.voice_id,
            engine=voice.engine,
            text="hello",
            text_chars=5,
            format="wav",
            status=SynthesisJob.Status.QUEUED,
            queued_at=clock.now,
            dispatched_at=clock.now,
        )
        for _ in range(BACKLOG)
    )
    with app.producer_or_acquire() as producer:
        for job in jobs:
            app.send_task(
                dispatch.SYNTHESIZE_JOB,
                args=(str(job.id),),
                queue=dispatch.queue_for_engine(job.engine),
                producer=producer,
            )
    return [job.id for job in jobs]


def test_a_backlog_with_no_worker_keeps_one_message_per_queued_job(
    clock: Clock,
    stack: Stack,
    probe_queue: str,
    media: Path,
    org: Any,
    voice: Any,
    lock_free: None,
    settings: Any,
) -> None:
    settings.TTS_JOB_MAX_QUEUE_SECONDS = 24 * 3600  # the backlog waits; none times out here
    r = stack.redis_client()
    _queue_backlog(org, voice, clock)
    assert r.llen(probe_queue) == BACKLOG

    # Every job is past the re-send period: today's messages still wait, so none is sent again.
    for _ in range(3):
        clock.advance(settings.TTS_JOB_REDELIVER_SECONDS + 1)
        counts = run_job("sweep_lost_deliveries").counts
        assert counts.get("resent", 0) == 0, counts
        assert r.llen(probe_queue) == BACKLOG

    # 300 messages lost (a purge, a Redis that lost its last second of writes): those 300 come back.
    r.ltrim(probe_queue, 0, BACKLOG - 301)
    assert r.llen(probe_queue) == BACKLOG - 300
    assert run_job("sweep_lost_deliveries").counts["resent"] == 300
    assert r.llen(probe_queue) == BACKLOG
    clock.advance(settings.TTS_JOB_REDELIVER_SECONDS + 1)
    assert run_job("sweep_lost_deliveries").counts.get("resent", 0) == 0
    assert r.llen(probe_queue) == BACKLOG
