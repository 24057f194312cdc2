"""remove_orphan_files: unreferenced files past the grace period go; referenced, fresh and in-progress ones stay."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from tests.integration.housekeeping.conftest import Clock, write_file
from webapp.housekeeping.catalog import run_job
from webapp.speech import lifecycle
from webapp.speech.models import Voice


def test_an_orphan_older_than_grace_goes_and_a_just_written_one_stays(
    clock: Clock, media: Path, make_audio_job: Any, org: Any, voice: Any, lock_free: None
) -> None:
    grace = settings.TTS_ORPHAN_GRACE_SECONDS
    old = clock.now - dt.timedelta(seconds=grace + 60)
    audio = media / "audio" / str(org.id)

    orphan = write_file(audio / f"{uuid.uuid4()}.wav", 1234, mtime=old)
    nested_orphan = write_file(media / "stray" / "deep" / "file.bin", 100, mtime=old)
    just_written = write_file(audio / f"{uuid.uuid4()}.wav", 10, mtime=clock.now)
    # The synth library's temp name while it writes: old mtime (a slow pass) is not enough.
    in_progress = write_file(audio / f".{uuid.uuid4()}.wav.{uuid.uuid4().hex}.part", 10, mtime=old)
    referenced_job = make_audio_job(clock.now + dt.timedelta(days=1))
    os.utime(media / referenced_job.audio_path, (old.timestamp(), old.timestamp()))
    prompt = write_file(media / "voices" / str(org.id) / "prompt.wav", 50, mtime=old)
    Voice.objects.filter(pk=voice.pk).update(prompt_path=str(prompt.relative_to(media)))
    # The output of a job still running (its row has no audio_path yet).
    running = lifecycle.submit_job(
        org,
        lifecycle.JobRequest(
            text="Hi.", voice=voice, format="wav", sample_rate=None, params={}, billable_chars=3
        ),
    )[0]
    running_output = write_file(audio / f"{running.id}.wav", 10, mtime=old)
    # Temp folders are purge_temp_files' business, not this job's.
    in_tmp = write_file(media / "tmp" / "x.wav", 10, mtime=old)
    link = audio / "link.wav"
    link.symlink_to(orphan)
    os.utime(link, (old.timestamp(), old.timestamp()), follow_symlinks=False)

    result = run_job("remove_orphan_files", batch=2)

    assert not orphan.exists() and not nested_orphan.exists()
    for kept in (
        just_written,
        in_progress,
        media / referenced_job.audio_path,
        prompt,
        running_output,
        in_tmp,
    ):
        assert kept.exists(), kept
    assert link.is_symlink()
    assert result.counts["removed"] == 2
    assert result.counts["bytes_freed"] == 1334
    assert result.counts["referenced"] == 3

    # A temp file abandoned for longer than any job may run is an orphan too.
    clock.advance(max(settings.TTS_TEMP_MAX_AGE_SECONDS, 2 * settings.TTS_MAX_JOB_SECONDS) + 60)
    os.utime(just_written, (clock.now.timestamp(), clock.now.timestamp()))
    result = run_job("remove_orphan_files")
    assert not in_progress.exists()
    assert just_written.exists() and prompt.exists() and running_output.exists()
    assert result.counts["removed"] == 1
