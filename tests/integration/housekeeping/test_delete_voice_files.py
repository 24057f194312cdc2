"""delete_voice_files: a deleted voice's prompt file goes and its path is cleared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.housekeeping.conftest import Clock, write_file
from webapp.housekeeping.catalog import run_job
from webapp.speech.models import Voice


def test_files_of_deleted_voices_are_removed(clock: Clock, media: Path, org: Any, lock_free: None) -> None:
    def make(name: str, status: str, prompt_path: str) -> Voice:
        return Voice.objects.create(
            voice_id=f"{org.slug}-{name}",
            organization=org,
            name=name,
            engine="piper",
            language="en_US",
            sample_rate=22050,
            status=status,
            prompt_path=prompt_path,
            prompt_bytes=700,
        )

    gone_file = write_file(media / "voices" / str(org.id) / "gone.wav", 700)
    kept_file = write_file(media / "voices" / str(org.id) / "kept.wav", 700)
    outside = write_file(media.parent / f"{media.name}-outside.wav", 10)
    gone = make("gone", Voice.Status.DELETED, str(gone_file.relative_to(media)))
    kept = make("kept", Voice.Status.READY, str(kept_file.relative_to(media)))
    missing = make(
        "missing", Voice.Status.DELETED, "voices/nope.wav"
    )  # file already gone: path still cleared
    escaping = make("escaping", Voice.Status.DELETED, f"../{outside.name}")  # never outside MEDIA_ROOT
    try:
        result = run_job("delete_voice_files", batch=2)

        assert not gone_file.exists() and kept_file.exists() and outside.exists()
        for voice in (gone, missing, escaping):
            voice.refresh_from_db()
            assert (voice.prompt_path, voice.prompt_bytes) == ("", 0)
        kept.refresh_from_db()
        assert kept.prompt_path and kept.prompt_bytes == 700
        assert result.counts == {"voices": 3, "bytes_freed": 700}
        assert run_job("delete_voice_files").counts == {}
    finally:
        outside.unlink(missing_ok=True)
