"""forget_one_off_voices: a request's reference audio left without a job to run goes, prompt file too;
one a queued job still needs, and one younger than the grace period, stay."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

from tests.integration.housekeeping.conftest import Clock, write_file
from webapp.housekeeping.catalog import run_job
from webapp.speech.models import SynthesisJob, Voice


def test_one_off_voices_without_a_job_to_run_are_deleted_after_the_grace(
    clock: Clock,
    media: Path,
    org: Any,
    lock_free: None,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    def one_off(name: str, age: float) -> Voice:
        pk = uuid.uuid4()
        relative = f"voices/{org.id}/{pk.hex}.wav"
        write_file(media / relative, 700)
        return Voice.objects.create(
            id=pk,
            voice_id=f"voice-{pk.hex}",
            organization=org,
            name=name,
            engine="",
            language="",
            sample_rate=16000,
            status=Voice.Status.READY,
            prompt_path=relative,
            prompt_bytes=700,
            one_off=True,
            cloning_mode="zero_shot",
            created_at=clock.now - dt.timedelta(seconds=age),
        )

    grace = settings.TTS_ONE_OFF_VOICE_GRACE_SECONDS
    left = one_off("left", grace + 60)  # its request died before its submit
    needed = one_off("needed", grace + 60)  # a queued job still clones from it
    young = one_off("young", grace - 60)  # its request may be submitting now
    SynthesisJob.objects.create(
        organization=org,
        voice=needed,
        voice_name=needed.voice_id,
        engine="voxcpm",
        text="hello",
        text_chars=5,
        format="wav",
        status=SynthesisJob.Status.QUEUED,
    )
    with django_capture_on_commit_callbacks(execute=True):  # the files go once the deletion commits
        result = run_job("forget_one_off_voices")
    assert result.counts == {"deleted": 1}
    assert set(Voice.objects.filter(organization=org).values_list("name", flat=True)) == {"needed", "young"}
    assert not (media / left.prompt_path).exists()
    assert (media / needed.prompt_path).exists() and (media / young.prompt_path).exists()
    assert run_job("forget_one_off_voices").counts == {}
