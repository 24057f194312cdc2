"""The sentence cache, synth side: keys, the entry format, and stitching hits with fresh audio.

A job's sentences are looked up in a :class:`SentenceStore` (injected; the webapp
keeps one per tenant and voice on disk) under a key of everything that decides
their sound; only the misses go to the engine, and what it renders is stored.
Hits come back as the float32 samples that were stored, bit for bit, so a job
served from the cache is exactly as long as the job that filled it, and the
pauses between sentences are added afterwards as for any job. Whole-job steps
(loudness normalisation, resampling, encoding) run after the stitching.

An entry is a header line of JSON (format, sample rate, frames, the payload's
SHA-256, and ``meta``: an opaque JSON-able value per sentence, e.g. its word
timings) followed by the raw little-endian float32 samples. Anything that does
not add up (truncated, wrong checksum, unreadable) decodes to None: a miss.
A store that fails to write (full disk) loses the entry, never the job.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from synth.engines.base import CancelFn, Pieces, ProgressFn, check_cancel

if TYPE_CHECKING:
    import numpy as np

    from synth.engines.base import VoiceParams
    from synth.registry import VoiceInfo

log = logging.getLogger(__name__)

# Bumped whenever what an entry holds, or how a key is made, changes: old entries then miss.
CACHE_FORMAT = 1
MAGIC = b"TTSSC1\n"
MAX_HEADER = 1 << 20  # bytes: a header longer than this is not ours
# A run of hits reports progress (a database write in the worker: the lease, the cancel flag) at
# most this often, and at the last sentence of a job that ran longer; a rendered sentence always reports.
HIT_PROGRESS_SECONDS = 0.5


@dataclass
class SentenceEntry:
    """One rendered sentence: float32 mono samples at ``sample_rate``, and an opaque JSON-able sidecar."""

    audio: np.ndarray
    sample_rate: int
    meta: Any = None


class SentenceStore(Protocol):
    """Where rendered sentences are kept. ``get`` answers None for anything it cannot return whole."""

    def get(self, key: str) -> SentenceEntry | None: ...

    def put(self, key: str, entry: SentenceEntry) -> None: ...


def encode_entry(entry: SentenceEntry) -> bytes:
    import numpy as np

    payload = np.ascontiguousarray(entry.audio, dtype="<f4").tobytes()
    header = {
        "format": CACHE_FORMAT,
        "sample_rate": int(entry.sample_rate),
        "frames": len(payload) // 4,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "meta": entry.meta,
    }
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def decode_entry(data: bytes) -> SentenceEntry | None:
    """The entry in ``data``, or None when it is not one whole, intact entry."""
    import numpy as np

    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    if end < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC) : end])
        frames, rate, digest = int(header["frames"]), int(header["sample_rate"]), str(header["sha256"])
        if header.get("format") != CACHE_FORMAT or rate <= 0:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    payload = data[end + 1 :]
    if len(payload) != frames * 4 or hashlib.sha256(payload).hexdigest() != digest:
        return None
    audio = np.frombuffer(payload, dtype="<f4").astype(np.float32)
    return SentenceEntry(audio, rate, header.get("meta"))


class MemoryStore:
    """A store in a dict (tests, benches); entries are encoded as on disk, so they round-trip the same."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    def get(self, key: str) -> SentenceEntry | None:
        data = self.entries.get(key)
        return None if data is None else decode_entry(data)

    def put(self, key: str, entry: SentenceEntry) -> None:
        self.entries[key] = encode_entry(entry)


# --------------------------------------------------------------------- keys

_FILE_HASHES: dict[tuple[str, int, int], str] = {}
_FILE_HASHES_LOCK = threading.Lock()


def file_hash(path: str | None) -> str:
    """SHA-256 of a file (a voice model), remembered per (path, size, mtime): hashed once per change."""
    if not path:
        return ""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    memo = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    with _FILE_HASHES_LOCK:
        known = _FILE_HASHES.get(memo)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    with _FILE_HASHES_LOCK:
        _FILE_HASHES[memo] = value
    return value


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


@cache  # read from the installed packages' metadata: milliseconds a call, fixed for a process
def runtime_versions(engine: str, piper_runtime: str) -> dict[str, str]:
    """The software that turns text into samples for ``engine``: a new version may sound different."""
    if engine == "piper":
        runtime = "torch" if piper_runtime == "torch" else "onnxruntime"
        return {"runtime": runtime, runtime: _version(runtime), "piper-tts": _version("piper-tts")}
    if engine == "espeak":
        return {"runtime": engine, "espeakng-loader": _version("espeakng-loader")}
    from synth.registry import engine_distribution

    dist = engine_distribution(engine)  # a plugin: the package that provides it
    return {"runtime": engine, **({dist[0]: dist[1]} if dist else {})}


def key_basis(
    voice: VoiceInfo, params: VoiceParams, native_rate: int, engine: str, piper_runtime: str
) -> str:
    """The digest of everything but the text that decides a sentence's sound, taken once per job.

    The voice (its id and its files' hashes: a voice replaced under the same id
    misses), the engine and runtime versions, every control after instructions
    were applied (``params``: speed, pitch, volume, language, noise, seed, a
    cloning prompt with its file's hash), and the native sample rate. The pause
    between sentences is not part of it: it is added after the lookup.
    """
    prompt = params.prompt
    values = {k: v for k, v in asdict(params).items() if k != "prompt"}
    basis = {
        "format": CACHE_FORMAT,
        "voice": voice.id,
        "voice_file": file_hash(voice.model_path),
        "voice_config": file_hash(voice.model_path + ".json") if voice.model_path else "",
        "engine": engine,
        "versions": runtime_versions(engine, piper_runtime),
        "params": values,
        "prompt": None
        if prompt is None
        else {
            "audio": file_hash(prompt.audio_path),
            "rate": prompt.sample_rate,
            "transcript": prompt.transcript,
            "embedding": list(prompt.embedding),
        },
        "native_rate": int(native_rate),
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()


def sentence_key(basis: str, text: str) -> str:
    """The key of one sentence: the job's basis and the exact text the engine is given."""
    return hashlib.sha256(f"{basis}\n{text}".encode()).hexdigest()


# --------------------------------------------------------------------- stitching


@dataclass
class CacheStats:
    """What the cache did for one job: hits, the characters they covered, entries written."""

    hits: int = 0
    misses: int = 0
    cached_characters: int = 0
    stored: int = 0
    store_failed: bool = False
    # Per sentence index: the sidecar of a hit (what the engine would have given, e.g. word timings).
    meta: dict[int, Any] = field(default_factory=dict)


Render = Callable[[Iterable[str], int], Iterator["np.ndarray | Pieces"]]


def cached_sentences(
    chunks: list[str],
    keys: list[str],
    store: SentenceStore,
    render: Render,
    native_rate: int,
    stats: CacheStats,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
    meta_of: Callable[[int], Any] | None = None,
) -> Iterator[np.ndarray | Pieces]:
    """Each chunk's audio in order: a stored one where the store has it, the engine's otherwise.

    ``render(chunks, total)`` is the engine's ``synthesize`` over the misses; it is
    fed one miss at a time, as the sentence is needed, so it runs once per job
    (batching and per-job state work as without a cache). The cancel check runs
    per sentence; ``progress`` after each rendered sentence, and after hits at most
    every HIT_PROGRESS_SECONDS and at the last sentence of a job that took longer (a hit takes a
    file read). What the engine rendered is
    put into the store as it comes (``meta_of(i)``: the sidecar of sentence ``i``);
    a store that fails once is left alone for the rest of the job. A sentence the
    job itself stored is not read back by a repeat later in its text: what a job
    costs and how long it runs depend on what the tenant rendered before it, not on
    repeats inside its own text (a long job of repeated sentences stays long).
    """
    import numpy as np

    pending: deque[str] = deque()

    def feed() -> Iterator[str]:
        while pending:
            yield pending.popleft()

    engine: Iterator[np.ndarray | Pieces] | None = None
    total = len(chunks)
    started = reported = time.monotonic()
    stored_here: set[str] = set()

    def keep(i: int, audio: np.ndarray) -> None:
        if not stats.store_failed:
            meta = meta_of(i) if meta_of else None
            _put(store, keys[i], SentenceEntry(audio, native_rate, meta), stats)
            stored_here.add(keys[i])

    def kept_once_whole(i: int, parts: Pieces) -> Iterator[np.ndarray]:
        """The parts as they come; the sentence is stored once its last came (not if it broke off)."""
        got = []
        for part in parts:
            got.append(np.asarray(part, dtype=np.float32))
            yield got[-1]
        keep(i, np.concatenate(got) if got else np.zeros(0, dtype=np.float32))

    try:
        for i, chunk in enumerate(chunks):
            check_cancel(should_cancel)
            audio: np.ndarray | Pieces
            # Read as needed: a long job holds one entry at a time.
            entry = None if keys[i] in stored_here else store_get(store, keys[i])
            if entry is not None and entry.sample_rate == native_rate:
                stats.hits += 1
                stats.cached_characters += len(chunk)
                stats.meta[i] = entry.meta
                audio = entry.audio
            else:
                if engine is None:
                    engine = render(feed(), total - i)
                pending.append(chunk)
                rendered = next(engine)
                stats.misses += 1
                if isinstance(rendered, Pieces):
                    audio = Pieces(kept_once_whole(i, rendered))
                else:
                    audio = np.asarray(rendered, dtype=np.float32)
                    keep(i, audio)
            yield audio
            now = time.monotonic()
            # A job that ends on hits within HIT_PROGRESS_SECONDS says nothing at its end: its
            # completion follows at once, and the lease it was claimed with is still young.
            last = i + 1 == total and now - started >= HIT_PROGRESS_SECONDS
            due = entry is None or last or now - reported >= HIT_PROGRESS_SECONDS
            if progress is not None and due:
                progress(i + 1, total)
                reported = now
        if engine is not None:
            for _ in engine:  # the engine's own end (its per-job state) runs now
                pass
    finally:
        if engine is not None and hasattr(engine, "close"):
            engine.close()


def store_get(store: SentenceStore, key: str) -> SentenceEntry | None:
    """A store's answer; one that raises is a miss (the cache never fails a job)."""
    try:
        return store.get(key)
    except Exception as exc:
        log.warning("sentence cache: lookup failed, treated as a miss: %s", exc)
        return None


def _put(store: SentenceStore, key: str, entry: SentenceEntry, stats: CacheStats) -> None:
    try:
        store.put(key, entry)
        stats.stored += 1
    except Exception as exc:  # a full disk: the job goes on uncached
        stats.store_failed = True
        log.warning("sentence cache: could not store a sentence, the job goes on uncached: %s", exc)


__all__ = [
    "CACHE_FORMAT",
    "CacheStats",
    "MemoryStore",
    "SentenceEntry",
    "SentenceStore",
    "cached_sentences",
    "decode_entry",
    "encode_entry",
    "key_basis",
    "sentence_key",
]
