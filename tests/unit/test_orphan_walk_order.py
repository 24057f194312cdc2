"""The orphan sweep's walk resumes after any file exactly where a walk from the root would go on."""

from __future__ import annotations

from pathlib import Path

from webapp.housekeeping.disk import _files_in_order, _walk_key


def test_a_walk_resumed_after_any_file_yields_exactly_the_files_after_it(tmp_path: Path) -> None:
    for relative in (
        "a.wav",
        "b/x.wav",
        "b/c/y.wav",
        "b/c/z.wav",
        "b/d/e/f.wav",
        "b/zz.wav",
        "ba/q.wav",
        "skip/s.wav",
        "z.wav",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(b"x")
    skip = {tmp_path / "skip"}
    walk = [relative for _, relative in _files_in_order(tmp_path, skip, None)]
    # A folder's own files first, then its subfolders, each sorted.
    assert walk == [
        "a.wav",
        "z.wav",
        "b/x.wav",
        "b/zz.wav",
        "b/c/y.wav",
        "b/c/z.wav",
        "b/d/e/f.wav",
        "ba/q.wav",
    ]
    assert walk == sorted(walk, key=_walk_key)
    for i, relative in enumerate(walk):
        resumed = [r for _, r in _files_in_order(tmp_path, skip, _walk_key(relative))]
        assert resumed == walk[i + 1 :], relative
