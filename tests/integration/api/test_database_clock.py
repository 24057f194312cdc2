"""Times other processes judge follow the database clock, not the clock of the host that wrote them.

A host whose clock is a day ahead (here: ``django.utils.timezone.now`` of this
process, moved on a day) must not write an audio expiry, an analysis lease or a
metrics watermark a day off: each is set from PostgreSQL's ``now()``. Rate
windows stay on Redis's clock (webapp/ratelimit.py), not checked here.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.integration.api.direct_jobs import submit_espeak

SKEW = dt.timedelta(days=1)
CLOSE = dt.timedelta(minutes=2)


def _db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now: dt.datetime = cursor.fetchone()[0]
    return now


@pytest.fixture
def skewed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected fault: this process's clock runs a day ahead of the database's."""
    from django.utils import timezone

    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + SKEW)


@pytest.fixture
def org(transactional_db: None, builtin_voices: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from webapp.speech.services import dispatch
    from webapp.tenants.models import Plan
    from webapp.tenants.services import create_organization

    # The test plays the worker: no message is sent.
    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)
    monkeypatch.setattr(dispatch, "send_analysis", lambda voice_pk: None)
    plan = Plan.objects.create(slug=f"clock-{uuid.uuid4().hex[:8]}", name="Clock", retention_days=7)
    return create_organization("Clock tenant", plan=plan)


def test_the_audio_expiry_follows_the_database_clock(org: Any, skewed_host: None) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    job = submit_espeak(org)
    claimed = lifecycle.claim_job(job.id, "clock-worker:1")
    assert claimed is not None
    assert lifecycle.complete_job(
        job.id,
        claimed.claim_token,
        audio_path="audio/x.wav",
        audio_bytes=10,
        duration_seconds=1.0,
        metrics={},
        applied_instructions={},
    )
    row = SynthesisJob.objects.get(pk=job.id)
    now = _db_now()
    assert row.finished_at is not None and abs(row.finished_at - now) < CLOSE, (row.finished_at, now)
    assert row.expires_at is not None
    assert abs(row.expires_at - (now + dt.timedelta(days=7))) < CLOSE, (row.expires_at, now)


def test_the_analysis_lease_follows_the_database_clock(org: Any, skewed_host: None, settings: Any) -> None:
    from webapp.speech.models import Voice
    from webapp.speech.services import prompts

    voice = Voice.objects.create(
        voice_id=f"clock-{uuid.uuid4().hex[:8]}",
        organization=org,
        name="Clock",
        engine="",
        language="",
        sample_rate=16000,
        status=Voice.Status.PROCESSING,
    )
    claimed = prompts.claim_analysis(voice.pk)
    assert claimed is not None and claimed.analysis_lease_until is not None
    lease = dt.timedelta(seconds=settings.TTS_ANALYSIS_TIME_LIMIT_SECONDS + 60)
    now = _db_now()
    assert abs(claimed.analysis_lease_until - (now + lease)) < CLOSE, (claimed.analysis_lease_until, now)
    # And it is judged by the database clock: a lease expired by it is taken again, at once.
    Voice.objects.filter(pk=voice.pk).update(analysis_lease_until=now - dt.timedelta(seconds=5))
    again = prompts.claim_analysis(voice.pk)
    assert again is not None and again.analysis_attempts == 2


@pytest.fixture
def watermark(stack: Any) -> Iterator[Any]:
    """No metrics watermark at the start; whatever was there is put back after."""
    from webapp.metrics import rollup

    r = stack.redis_client()
    before = r.get(rollup.WATERMARK_KEY)
    r.delete(rollup.WATERMARK_KEY, rollup.LOCK_KEY)
    yield r
    r.delete(rollup.WATERMARK_KEY)
    if before is not None:
        r.set(rollup.WATERMARK_KEY, before)


def test_the_metrics_watermark_follows_the_database_clock(
    transactional_db: None, watermark: Any, skewed_host: None
) -> None:
    from webapp.metrics import rollup

    assert rollup.advance() is False  # the first call only sets the watermark
    raw = watermark.get(rollup.WATERMARK_KEY)
    mark = dt.datetime.fromisoformat(raw.decode() if isinstance(raw, bytes) else raw)
    now = _db_now()
    assert abs(mark - (now - rollup.LAG)) < CLOSE, (mark, now)
