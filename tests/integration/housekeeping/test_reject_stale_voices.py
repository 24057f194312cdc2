"""reject_stale_voices: a prompt stuck in processing past the timeout is rejected with a reason."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from tests.integration.housekeeping.conftest import Clock
from webapp.housekeeping.catalog import run_job
from webapp.speech.models import Voice


def test_a_voice_left_processing_too_long_is_rejected(clock: Clock, org: Any, lock_free: None) -> None:
    def make(name: str, status: str) -> Voice:
        return Voice.objects.create(
            voice_id=f"{org.slug}-{name}",
            organization=org,
            name=name,
            engine="piper",
            language="en_US",
            sample_rate=22050,
            status=status,
        )

    stuck, ready = make("stuck", Voice.Status.PROCESSING), make("ready", Voice.Status.READY)
    clock.advance(settings.TTS_VOICE_PROCESSING_TIMEOUT_SECONDS - 60)
    recent = make("recent", Voice.Status.PROCESSING)
    clock.advance(120)

    assert run_job("reject_stale_voices").counts == {"rejected": 1}

    stuck.refresh_from_db()
    assert stuck.status == Voice.Status.REJECTED
    assert "did not finish" in stuck.status_reason and "upload it again" in stuck.status_reason
    assert Voice.objects.get(pk=recent.pk).status == Voice.Status.PROCESSING
    assert Voice.objects.get(pk=ready.pk).status == Voice.Status.READY
    assert run_job("reject_stale_voices").counts == {}
