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
