"""purge_temp_files: old files and empty folders in the temp folders go; recent ones stay."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from django.conf import settings

from tests.integration.housekeeping.conftest import Clock, write_file
from webapp.housekeeping.catalog import run_job
from webapp.housekeeping.disk import temp_dirs


def test_old_temp_files_are_purged_and_recent_ones_stay(
    db: None, clock: Clock, media: Path, lock_free: None
) -> None:
    old = clock.now - dt.timedelta(seconds=settings.TTS_TEMP_MAX_AGE_SECONDS + 60)
    media_tmp, var_tmp = (Path(p) for p in settings.TTS_TEMP_DIRS)
    stale = [
        write_file(media_tmp / "upload-1.wav", 300, mtime=old),
        write_file(var_tmp / "work" / "chunk.f32", 200, mtime=old),
    ]
    recent = write_file(media_tmp / "upload-2.wav", 100, mtime=clock.now - dt.timedelta(minutes=5))
    os.utime(var_tmp / "work", (old.timestamp(), old.timestamp()))
    outside = write_file(media / "audio" / "keep.wav", 10, mtime=old)

    result = run_job("purge_temp_files")

    assert not any(p.exists() for p in stale)
    assert not (var_tmp / "work").exists()  # emptied and old
    assert recent.exists() and media_tmp.is_dir() and var_tmp.is_dir()
    assert outside.exists()
    assert result.counts == {"removed": 2, "bytes_freed": 500, "folders_removed": 1}
    assert run_job("purge_temp_files").counts == {}


def test_a_temp_setting_naming_media_root_or_var_is_refused(settings: Any, media: Path) -> None:
    settings.TTS_TEMP_DIRS = [str(media), str(settings.VAR_DIR), "/", str(media / "tmp")]
    assert temp_dirs() == [(media / "tmp").resolve()]
