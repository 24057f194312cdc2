"""Where stored files (job audio, voice prompts) live: always under MEDIA_ROOT.

Rows hold paths relative to MEDIA_ROOT. Every read, delete or download goes
through :func:`media_path`, which refuses a path that would leave the media
root (an absolute path, ``..``, or a symlink pointing out), so an edited row
can never make the service read or delete another file.
"""

from __future__ import annotations

import logging
import os

from django.conf import settings

log = logging.getLogger(__name__)


class UnsafePath(ValueError):
    """A stored path that does not stay inside MEDIA_ROOT."""


def media_path(relative: str) -> str:
    """The absolute path of a stored file, or UnsafePath if it is not inside MEDIA_ROOT."""
    root = os.path.realpath(str(settings.MEDIA_ROOT))
    if not relative or os.path.isabs(relative) or "\x00" in relative:
        raise UnsafePath(f"{relative!r} is not a path relative to the media root")
    path = os.path.realpath(os.path.join(root, relative))
    if path == root or os.path.commonpath([root, path]) != root:
        raise UnsafePath(f"{relative!r} leaves the media root")
    return path


def remove_file(relative: str) -> int:
    """Delete a stored file; returns the bytes freed (0 when missing, empty or unsafe)."""
    if not relative:
        return 0
    try:
        path = media_path(relative)
    except UnsafePath as exc:
        log.error("refusing to delete %s", exc)
        return 0
    try:
        size = os.path.getsize(path)
        os.unlink(path)
        return size
    except FileNotFoundError:
        return 0
