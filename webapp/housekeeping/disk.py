"""Housekeeping of files: orphans under MEDIA_ROOT and old files in the temp folders."""

from __future__ import annotations

import json
import logging
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings
from django.db import models

from webapp import redis_clients
from webapp.housekeeping.jobs import Context, job
from webapp.provisioning import is_temp_name
from webapp.speech.models import SynthesisJob, Voice

log = logging.getLogger("webapp.housekeeping")


def media_root() -> Path:
    return Path(settings.MEDIA_ROOT).resolve()


def unlink_file(path: Path) -> int:
    """Unlink a file found by a sweep (never a folder); returns the bytes freed (0 when already gone)."""
    try:
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            return 0
        path.unlink()
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def voice_path_fields() -> list[str]:
    """Every ``*_path`` field of Voice (prompt_path today; embeddings may follow)."""
    return [
        f.name
        for f in Voice._meta.get_fields()
        if isinstance(f, models.CharField) and f.name.endswith("_path")
    ]


def temp_dirs() -> list[Path]:
    """The configured temp folders, minus any that would be dangerous to purge."""
    protected = {Path("/"), media_root(), Path(settings.VAR_DIR).resolve(), Path(settings.BASE_DIR).resolve()}
    out = []
    for raw in settings.TTS_TEMP_DIRS:
        path = Path(raw).resolve()
        # Never the root, MEDIA_ROOT, var/ or the checkout, nor a folder above one of them.
        if any(path == p or path in p.parents for p in protected):
            log.warning("housekeeping: not purging %s, it is not a temp folder", path)
            continue
        out.append(path)
    return out


@dataclass(frozen=True)
class _Candidate:
    relative: str
    path: Path
    size: int
    mtime: float


def _job_id_of(name: str) -> str | None:
    """Audio files (and their temp files) are named after their job's UUID."""
    try:
        return str(uuid.UUID(name.lstrip(".").split(".", 1)[0]))
    except ValueError:
        return None


def _current_attempt_file(name: str, active: dict[str, int]) -> bool:
    """A file of an active job that its current (or a future) attempt may still publish.

    Attempts name their files ``<job>.<claim token>.<format>``; files of an
    earlier token belong to a dead or superseded attempt and can never become
    the job's audio (docs/workers.md, "Fencing").
    """
    job_id = _job_id_of(name)
    if job_id not in active:
        return False
    token = name.lstrip(".").split(".")[1:2]
    return not (token and token[0].isdigit() and int(token[0]) < active[job_id])


def _remove_unreferenced(candidates: list[_Candidate], ctx: Context) -> None:
    if not candidates:
        return
    # Every job file is named after its job (``<job>.<token>.<format>``, temp files
    # ``.<that>.<hex>.part``), so the jobs are read by primary key, never by path:
    # a path lookup scanned the whole jobs table per batch. One statement, so a job
    # finishing meanwhile is seen either active or with its audio_path (set as it
    # leaves running), never neither.
    job_ids = {jid for c in candidates if (jid := _job_id_of(c.path.name))}
    active: dict[str, int] = {}
    referenced: set[str] = set()
    for job_id, status, token, audio_path in SynthesisJob.objects.filter(id__in=job_ids).values_list(
        "id", "status", "claim_token", "audio_path"
    ):
        if status in SynthesisJob.ACTIVE:
            active[str(job_id)] = token
        if audio_path:
            referenced.add(audio_path)
    relatives = [c.relative for c in candidates]
    for name in voice_path_fields():  # few rows: one per voice
        referenced.update(Voice.objects.filter(**{f"{name}__in": relatives}).values_list(name, flat=True))
    for c in candidates:
        if c.relative in referenced or _current_attempt_file(c.path.name, active):
            ctx.add("referenced")
            continue
        try:
            if c.path.lstat().st_mtime != c.mtime:
                ctx.add("too_recent")  # written to since we looked
                continue
        except FileNotFoundError:
            continue
        freed = unlink_file(c.path)
        ctx.add("removed")
        ctx.add("bytes_freed", freed)


# Where a run that stopped at its budget left off, so the next one continues
# there instead of walking the same first files again (with a large media
# folder a sweep restarting from the root never reached the end). Kept with its
# MEDIA_ROOT; lost with Redis, the next run simply starts from the root.
CURSOR_KEY = "tts:housekeeping:cursor:remove_orphan_files"

_WalkKey = tuple[tuple[int, str], ...]


def _walk_key(relative: str) -> _WalkKey:
    """A file's place in the walk's order: a folder's files (sorted) before its subfolders (sorted)."""
    *folders, name = relative.split("/")
    return (*((1, f) for f in folders), (0, name))


def _load_cursor(client: redis.Redis, root: Path) -> _WalkKey | None:
    try:
        raw = client.get(CURSOR_KEY)
        saved = json.loads(raw) if raw else None
    except (redis.RedisError, ValueError) as exc:
        log.warning("housekeeping remove_orphan_files: no cursor (%s), starting from the root", exc)
        return None
    if not isinstance(saved, dict) or saved.get("root") != str(root):
        return None
    return _walk_key(str(saved["after"]))


def _save_cursor(client: redis.Redis, root: Path, after: str | None) -> None:
    try:
        if after is None:
            client.delete(CURSOR_KEY)
        else:
            client.set(CURSOR_KEY, json.dumps({"root": str(root), "after": after}))
    except redis.RedisError as exc:  # the next run starts from the root: more work, nothing wrong
        log.warning("housekeeping remove_orphan_files: could not keep the cursor: %s", exc)


def _files_in_order(root: Path, skip: set[Path], after: _WalkKey | None) -> Iterator[tuple[Path, str]]:
    """(path, path relative to root) of the files under root, in walk order, those after ``after`` only."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        folder = here.relative_to(root).parts
        prefix = tuple((1, f) for f in folder)
        dirnames[:] = sorted(d for d in dirnames if (here / d) not in skip)
        if after is not None:
            # A subfolder whose every file comes before the cursor is not entered.
            dirnames[:] = [d for d in dirnames if (*prefix, (1, d)) >= after[: len(prefix) + 1]]
        for name in sorted(filenames):
            relative = "/".join((*folder, name))
            if after is None or _walk_key(relative) > after:
                yield here / name, relative


@job(
    "remove_orphan_files",
    "Remove files under MEDIA_ROOT no job or voice references, older than the grace period.",
)
def remove_orphan_files(ctx: Context) -> None:
    root = media_root()
    if not root.is_dir():
        return
    now_ts = ctx.now.timestamp()
    cutoff = now_ts - settings.TTS_ORPHAN_GRACE_SECONDS
    # A temp-named file is some writer's work in progress; only a long-abandoned one
    # (older than any job may run, and than the temp age) is an orphan.
    temp_cutoff = now_ts - max(
        settings.TTS_TEMP_MAX_AGE_SECONDS, settings.TTS_ORPHAN_GRACE_SECONDS, 2 * settings.TTS_MAX_JOB_SECONDS
    )
    # Temp folders are purge_temp_files' business; voice models and static files
    # are nobody's rows, should they be configured inside MEDIA_ROOT.
    skip = set(temp_dirs()) | {
        Path(p).resolve()
        for p in (
            settings.TTS_VOICES_DIR,
            settings.STATIC_ROOT,
            settings.LOG_DIR,
            settings.TTS_SENTENCE_CACHE_DIR,  # no row names its entries: eviction bounds it
        )
    }
    client = redis_clients.locks()
    batch: list[_Candidate] = []
    scanned = 0
    for path, relative in _files_in_order(root, skip, _load_cursor(client, root)):
        scanned += 1
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            pass  # gone, or a link, a socket...: not ours to remove
        elif st.st_mtime > (temp_cutoff if is_temp_name(path.name) else cutoff):
            ctx.add("too_recent")
        else:
            batch.append(_Candidate(relative, path, st.st_size, st.st_mtime))
        if len(batch) >= ctx.batch:
            _remove_unreferenced(batch, ctx)
            batch = []
        elif scanned % 1000 != 0:
            continue  # the clock is read after each batch and every 1000 files
        if ctx.out_of_time():
            _remove_unreferenced(batch, ctx)
            _save_cursor(client, root, relative)  # every file up to here is handled
            return
    _remove_unreferenced(batch, ctx)
    _save_cursor(client, root, None)  # the walk reached the end: the next starts from the root


@job(
    "purge_temp_files",
    "Purge files (and empty folders) older than TTS_TEMP_MAX_AGE_SECONDS from the temp folders.",
)
def purge_temp_files(ctx: Context) -> None:
    cutoff = ctx.now.timestamp() - settings.TTS_TEMP_MAX_AGE_SECONDS
    seen = 0
    for top in temp_dirs():
        if not top.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
            here = Path(dirpath)
            try:
                # Taken before we unlink anything here, which bumps it: a folder
                # nobody wrote in for that long goes once it is empty.
                folder_mtime = here.lstat().st_mtime
            except FileNotFoundError:
                continue
            for name in filenames:
                path = here / name
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                if st.st_mtime > cutoff:
                    continue
                ctx.add("bytes_freed", unlink_file(path))
                ctx.add("removed")
                seen += 1
                if seen % ctx.batch == 0 and ctx.out_of_time():
                    return
            if here != top and folder_mtime <= cutoff:
                try:
                    here.rmdir()  # fails, harmlessly, when not empty
                    ctx.add("folders_removed")
                except OSError:
                    pass
