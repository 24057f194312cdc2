"""A full engine queue answers new submissions 503 queue_full with Retry-After, nothing reserved."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import problem

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")

TEXT = "Queue me."


def test_a_full_engine_queue_answers_503_queue_full_with_retry_after(make_tenant: Any, settings: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsagePeriod

    t = make_tenant()
    # In this (rolled back) test transaction no message is sent: the jobs stay queued.
    first = t.client.post("/api/v1/speech", {"text": TEXT})
    assert first.status_code == 202
    engine = SynthesisJob.objects.get(id=first.json()["id"]).engine
    queued = SynthesisJob.objects.filter(status="queued", engine=engine).count()
    settings.TTS_MAX_QUEUED_JOBS_PER_ENGINE = queued + 1
    assert t.client.post("/api/v1/speech", {"text": TEXT}).status_code == 202
    full = t.client.post("/api/v1/speech", {"text": TEXT})
    assert full.status_code == 503 and full["Retry-After"] == "30"
    body = problem(full)
    assert body["code"] == "queue_full" and "queue is full" in body["detail"]
    assert UsagePeriod.objects.get(organization=t.org).characters_reserved == 2 * len(TEXT)
    assert SynthesisJob.objects.filter(organization=t.org).count() == 2
    settings.TTS_MAX_QUEUED_JOBS_PER_ENGINE = 0  # no limit
    assert t.client.post("/api/v1/speech", {"text": TEXT}).status_code == 202
