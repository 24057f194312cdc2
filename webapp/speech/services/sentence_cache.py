"""The sentence cache on disk: one folder per tenant, one per voice in it (issue 33; synth.cache).

``TTS_SENTENCE_CACHE_DIR/<tenant>/voice-<voice pk>/<2 hex>/<key>.sc``: a tenant's
entries are never looked up from another tenant's folder, whatever the key, and
deleting a voice or a tenant empties its folder. Entries are written atomically
(a temp file in the same folder, fsync, ``os.replace``): a reader sees a whole
entry or none. Reads that find a broken entry (truncated by a crash, bad checksum)
answer a miss and remove it. Any OSError writing (a full disk) is raised to
synth.cache, which leaves the job uncached and goes on; below
``TTS_SENTENCE_CACHE_MIN_FREE_BYTES`` free on its disk nothing is written, so the
cache never takes the room a job's audio needs. A hit touches the entry's
mtime: housekeeping's eviction (``evict_sentence_cache``) removes the least
recently used first, down to the plan's ``sentence_cache_bytes``, and writes the
exact bytes on the tenant row, which the storage limit counts; then the oldest of
any tenant past the operator's ``TTS_SENTENCE_CACHE_MAX_BYTES``. The folder sits
beside the media the backup archives, not in what it archives (deploy/backup.py
takes only files rows name), and the orphan sweep leaves it alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import F, Sum
from django.db.models.functions import Greatest

from synth.cache import SentenceEntry, decode_entry, encode_entry
from webapp.speech.models import SynthesisJob
from webapp.tenants.models import Organization, Plan

log = logging.getLogger(__name__)

SUFFIX = ".sc"
TEMP_PREFIX = ".tmp-"
# A temp file older than this is a writer that died: eviction removes it.
TEMP_MAX_AGE_SECONDS = 3600


def root() -> Path:
    return Path(settings.TTS_SENTENCE_CACHE_DIR)


def tenant_folder(organization_id: Any) -> Path:
    return root() / str(organization_id)


def voice_folder(organization_id: Any, voice_pk: Any) -> Path:
    return tenant_folder(organization_id) / f"voice-{voice_pk}"


class DiskStore:
    """synth.cache.SentenceStore over one voice folder of one tenant."""

    def __init__(self, folder: Path, before_write: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self.before_write = before_write
        self.written = 0  # bytes of entries this store wrote

    def _path(self, key: str) -> Path:
        if len(key) < 8 or not key.isalnum():
            raise ValueError(f"not a cache key: {key[:80]!r}")
        return self.folder / key[:2] / f"{key}{SUFFIX}"

    def get(self, key: str) -> SentenceEntry | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None  # missing or unreadable: a miss
        entry = decode_entry(data)
        if entry is None:
            log.warning("sentence cache: broken entry %s removed", path.name)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU clock
        return entry

    def put(self, key: str, entry: SentenceEntry) -> None:
        path = self._path(key)
        data = encode_entry(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(path.parent).free - len(data) < settings.TTS_SENTENCE_CACHE_MIN_FREE_BYTES:
            # The disk is nearly full: what is left is the jobs' audio, not the cache's.
            log.info("sentence cache: not written, the disk is below TTS_SENTENCE_CACHE_MIN_FREE_BYTES")
            return
        tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as fh:
                if self.before_write is not None:
                    self.before_write()
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self.written += len(data)


def job_store(job: SynthesisJob, before_write: Callable[[], None] | None = None) -> DiskStore | None:
    """The store a job reads and fills; None when its request said ``cache: false``, its plan keeps
    no cache, or its voice is gone."""
    if not job.use_cache or job.voice_id is None:
        return None
    bound = Plan.objects.filter(organizations=job.organization_id).values_list(
        "sentence_cache_bytes", flat=True
    )
    if not bound.first():
        return None
    return DiskStore(voice_folder(job.organization_id, job.voice_id), before_write)


def count_written(organization_id: Any, written: int) -> None:
    """Entries a job wrote, added to the tenant's cache bytes until housekeeping counts them exactly."""
    if written > 0:
        Organization.objects.filter(pk=organization_id).update(
            sentence_cache_used=F("sentence_cache_used") + written
        )


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    mtime: float


def _files(folder: Path) -> Iterator[_File]:
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            path = Path(dirpath, name)
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            yield _File(path, st.st_size, st.st_mtime)


def _remove_folder(folder: Path) -> int:
    """Delete a folder of entries; the bytes freed."""
    freed = sum(f.size for f in _files(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return freed


def purge_tenant(organization_id: Any) -> int:
    """Every entry of a tenant (``DELETE /api/v1/cache``, the tenant's deletion); the bytes freed."""
    freed = _remove_folder(tenant_folder(organization_id))
    Organization.objects.filter(pk=organization_id).update(sentence_cache_used=0)
    return freed


def purge_voice(organization_id: Any, voice_pk: Any) -> int:
    """Every entry of one voice of a tenant (the voice was deleted); the bytes freed."""
    freed = _remove_folder(voice_folder(organization_id, voice_pk))
    if freed:
        Organization.objects.filter(pk=organization_id, sentence_cache_used__gte=freed).update(
            sentence_cache_used=F("sentence_cache_used") - freed
        )
    return freed


@dataclass(frozen=True)
class Eviction:
    removed: int
    freed: int
    kept_bytes: int


def evict(
    organization_id: Any, bound: int, now: float | None = None, max_age: float | None = None
) -> Eviction:
    """Remove the tenant's least recently used entries until it holds at most ``bound`` bytes, and
    those unused for ``max_age`` seconds (the plan's text retention: a cached sentence is the tenant's
    text spoken, and outlives no text it came from).

    Temp files of writers that died go too. The bytes kept are written on the tenant row.
    """
    now = time.time() if now is None else now
    entries: list[_File] = []
    removed = freed = 0
    for f in _files(tenant_folder(organization_id)):
        temp = f.path.name.startswith(TEMP_PREFIX)
        if temp and f.mtime >= now - TEMP_MAX_AGE_SECONDS:
            continue  # its writer may still be at it
        if temp or (max_age is not None and f.mtime < now - max_age):
            with contextlib.suppress(OSError):
                f.path.unlink()
                removed, freed = removed + 1, freed + f.size
            continue
        entries.append(f)
    kept = sum(f.size for f in entries)
    for f in sorted(entries, key=lambda f: f.mtime):
        if kept <= bound:
            break
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
        kept -= f.size
        removed, freed = removed + 1, freed + f.size
    Organization.objects.filter(pk=organization_id).update(sentence_cache_used=kept)
    return Eviction(removed, freed, kept)


def bytes_recorded() -> int:
    """The whole cache's bytes, as the tenant rows hold them (exact after each tenant's eviction)."""
    total = Organization.objects.aggregate(total=Sum("sentence_cache_used"))["total"]
    return int(total or 0)


def evict_oldest(cap: int) -> Eviction:
    """Remove the least recently used entries of any tenant until the whole cache holds at most ``cap``
    bytes; each tenant's row loses what went of it."""
    entries: list[tuple[str, _File]] = []
    for name in tenants_with_entries():
        entries += [(name, f) for f in _files(tenant_folder(name)) if not f.path.name.startswith(TEMP_PREFIX)]
    kept = sum(f.size for _, f in entries)
    freed_by: dict[str, int] = {}
    removed = 0
    for name, f in sorted(entries, key=lambda item: item[1].mtime):
        if kept <= cap:
            break
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
        kept -= f.size
        removed += 1
        freed_by[name] = freed_by.get(name, 0) + f.size
    for name, freed in freed_by.items():
        with contextlib.suppress(ValueError, ValidationError):  # a folder that names no tenant
            Organization.objects.filter(pk=name).update(
                sentence_cache_used=Greatest(F("sentence_cache_used") - freed, 0)
            )
    return Eviction(removed, sum(freed_by.values()), kept)


def zero_tenants_without_entries(with_entries: list[str]) -> int:
    """Tenants that count cache bytes but have no folder under the cache root get a count of 0; how many.

    A count no folder backs (a restore of the database without the cache, a folder lost to a disk
    swap) would hold the tenant at its storage limit, refusing every submit, for good: eviction only
    recounts the folders it finds. A folder made between the listing and this finds its count
    reset too; the next run, which lists it, counts it again.
    """
    return (
        Organization.objects.filter(sentence_cache_used__gt=0)
        .exclude(pk__in=with_entries)
        .update(sentence_cache_used=0)
    )


def tenants_with_entries() -> list[str]:
    """The tenant folders under the cache root (names: tenant ids)."""
    try:
        return sorted(p.name for p in root().iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
