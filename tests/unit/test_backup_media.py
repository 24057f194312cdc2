"""What a backup keeps: the media files rows name (the columns agree with the models), and the
newest TTS_BACKUP_KEEP archives of its folder, nothing else of it touched."""

from __future__ import annotations

import os
from pathlib import Path

from django.apps import apps
from django.db import models

from deploy.backup import MEDIA_COLUMNS, rotate


def test_the_backup_knows_every_column_that_names_a_media_file() -> None:
    """Every ``*_path`` text field of every model names a file under MEDIA_ROOT (webapp/speech/services/files.py)."""
    found: dict[str, set[str]] = {}
    for model in apps.get_models():
        for field in model._meta.concrete_fields:
            if isinstance(field, models.CharField) and field.name.endswith("_path"):
                found.setdefault(model._meta.db_table, set()).add(str(field.column))
    assert found == {table: set(columns) for table, columns in MEDIA_COLUMNS.items()}


def _touch(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(b"x")
    return path


def test_rotation_keeps_the_newest_archives_and_nothing_else_is_touched(tmp_path: Path) -> None:
    names = [
        "tts-backup-20261101-010000.tar.gz",  # clear, from before encryption: counts too
        "tts-backup-20261102-010000.tar.gz.age",
        "tts-backup-20261103-010000.tar.gz.age",
        "tts-backup-20261104-010000.tar.gz.age",
    ]
    for name in names:
        _touch(tmp_path, name)
    # Modification times opposite to the names: the time in the name decides.
    for age, name in enumerate(names):
        os.utime(tmp_path / name, (1e9 - age * 1000, 1e9 - age * 1000))
    others = [_touch(tmp_path, n) for n in ("notes.txt", "tts-backup-latest.tar.gz", "my.tar.gz.age")]
    _touch(tmp_path, ".tts-backup-20261105-010000.tar.gz.age.part")  # a backup under way
    deleted = rotate(tmp_path, 2)
    assert sorted(p.name for p in deleted) == names[:2]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [*names[2:], *(p.name for p in others), ".tts-backup-20261105-010000.tar.gz.age.part"]
    )
    assert rotate(tmp_path, 0) == [] and len(list(tmp_path.iterdir())) == len(left)  # 0 keeps all
