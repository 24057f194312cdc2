"""A restore unpacks only plain files and folders inside its archive, on any Python 3.11
(Debian 12's 3.11.2 has no tarfile extraction filters)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from deploy.backup import extract_safely
from deploy.provision import StackError


def _archive(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for member in members:
            data = b"x" * member.size
            archive.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


def test_it_unpacks_plain_files_and_folders(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("media")
    folder.type = tarfile.DIRTYPE
    archive = _archive(tmp_path / "ok.tar.gz", _file("manifest.json"), folder, _file("media/a.wav"))
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(archive, "r:gz") as opened:
        extract_safely(opened, out)
    assert (out / "media" / "a.wav").read_bytes() == b"x"


@pytest.mark.parametrize(
    "bad",
    [_file("../outside"), _file("/etc/outside"), _file("media/../../outside"), _link("media/l", "/etc")],
    ids=["dot-dot", "absolute", "dot-dot-inside", "symlink"],
)
def test_it_refuses_a_member_that_would_leave_the_folder_and_writes_nothing(
    tmp_path: Path, bad: tarfile.TarInfo
) -> None:
    archive = _archive(tmp_path / "bad.tar.gz", _file("manifest.json"), bad)
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(archive, "r:gz") as opened, pytest.raises(StackError, match="refusing to restore"):
        extract_safely(opened, out)
    assert list(out.iterdir()) == []
    assert not (tmp_path / "outside").exists()


def test_the_media_folder_is_archived_without_temp_files_or_links(tmp_path: Path) -> None:
    from deploy.backup import add_media

    media = tmp_path / "media"
    (media / "audio" / "org").mkdir(parents=True)
    (media / "audio" / "org" / "job.1.wav").write_bytes(b"RIFF")
    (media / "audio" / "org" / ".job.2.wav.ab12cd34.part").write_bytes(b"half")
    (media / "audio" / "org" / ".job.2.wav.ab12cd34.part.f32").write_bytes(b"half")
    (media / "audio" / "org" / "link.wav").symlink_to(media / "audio" / "org" / "job.1.wav")
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as archive:
        assert add_media(archive, media) == 0
    with tarfile.open(tmp_path / "a.tar.gz", "r:gz") as archive:
        names = {m.name: m for m in archive.getmembers()}
        assert set(names) == {"media", "media/audio", "media/audio/org", "media/audio/org/job.1.wav"}
        assert names["media/audio/org"].isdir()
        extracted = archive.extractfile("media/audio/org/job.1.wav")
        assert extracted is not None and extracted.read() == b"RIFF"


def test_a_backup_that_fails_while_writing_leaves_no_archive_nor_a_partial_one(tmp_path: Path) -> None:
    from deploy.backup import _write_archive

    out = tmp_path / "backups" / "b.tar.gz"
    out.parent.mkdir()

    def fails(archive: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"{}"))
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _write_archive(out, fails)
    assert list(out.parent.iterdir()) == []

    _write_archive(out, lambda archive: None)
    assert [p.name for p in out.parent.iterdir()] == ["b.tar.gz"]
    assert out.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "name",
    [
        "job.1.wav",
        ".job.1.wav.ab12.part",
        ".job.1.wav.ab12.part.f32",
        "~lock",
        "x.tmp",
        "x.tmp.1",
        "voice.wav",
    ],
)
def test_backup_and_the_orphan_sweep_agree_on_which_files_are_being_written(name: str) -> None:
    from deploy.backup import is_temp_name
    from webapp.housekeeping import disk

    assert is_temp_name is disk.is_temp_name  # one rule (webapp/provisioning.py), imported by both
    assert is_temp_name(name) == disk.is_temp_name(name)
