"""Voice prompts: untrusted uploads checked and converted in a separate process.

An uploaded prompt is read only by a child process (``python -m synth.prompt``)
that limits its own address space and CPU time before it imports a decoder, and
is killed by the caller after a wall-clock timeout: a malformed file that makes
libsndfile or FFmpeg spin or allocate hurts only that child. The child checks
what the header and a bounded decode can answer (magic bytes, sample rate,
duration, finite samples), measures the level (peak, clipping, speech level)
and writes the canonical form: mono, :data:`CANONICAL_RATE`, leading and
trailing silence trimmed, speech level normalised. What needs a model (voice
activity, speaker embedding, pitch) is synth.speaker's, on the analysis worker.

Module import is light (no numpy), so the web tier can import it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from synth.errors import AudioRejected

if TYPE_CHECKING:
    import numpy as np

PROMPT_MIN_SECONDS = 3.0
PROMPT_MAX_SECONDS = 15.0
MIN_SAMPLE_RATE = 16000
CANONICAL_RATE = 16000
# Speech level of the canonical form: RMS of the frames within 30 dB of the
# loudest, in dBFS (about -23 LUFS on speech), with the peak kept under -1 dBFS.
CANONICAL_SPEECH_DBFS = -23.0
CANONICAL_PEAK = 0.89
SILENCE_BELOW_PEAK_DB = 40.0  # a frame this far under the loudest is silence (trimmed at the ends)
TRIM_MARGIN_SECONDS = 0.1
CLIP_LEVEL = 0.999  # |sample| at or above this counts as clipped

# Codes of refusals the upload can get synchronously (HTTP status in webapp/problems.py).
UPLOAD_CODES = (
    "upload_too_large",
    "unsupported_media_type",
    "invalid_audio",
    "audio_too_short",
    "audio_too_long",
    "sample_rate_too_low",
)

# Leading bytes of the containers accepted; anything else is refused before a
# decoder sees it (FFmpeg would otherwise open playlists, images, text...).
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"RIFF", "wav"),
    (0, b"RF64", "wav"),
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),
    (0, b"ID3", "mp3"),
    (0, b"FORM", "aiff"),
    (4, b"ftyp", "mp4"),
    (0, b"\x1a\x45\xdf\xa3", "webm"),
)


class PromptRejected(AudioRejected):
    """A prompt refused; ``code`` is one of :data:`UPLOAD_CODES` or an analysis code."""


@dataclass(frozen=True)
class PromptLimits:
    max_bytes: int
    min_seconds: float = PROMPT_MIN_SECONDS
    max_seconds: float = PROMPT_MAX_SECONDS
    min_rate: int = MIN_SAMPLE_RATE
    timeout_seconds: float = 20.0
    memory_mb: int = 1024


@dataclass(frozen=True)
class PromptStats:
    """What the child measured on the decoded upload, before any gain."""

    container: str
    source_rate: int
    duration_seconds: float  # as decoded
    trimmed_seconds: float  # after trimming silence at both ends
    peak: float
    clipped_fraction: float
    speech_dbfs: float  # -inf for digital silence

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # JSON has no -inf; a silent file is reported at the floor.
        data["speech_dbfs"] = max(self.speech_dbfs, -120.0)
        return data


def sniff_container(head: bytes) -> str:
    """The container the first bytes announce, or raise ``unsupported_media_type``."""
    for offset, magic, name in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            if name == "wav" and head[8:12] != b"WAVE":
                break
            return name
    # MPEG audio without an ID3 tag starts with a frame sync (11 set bits); ADTS AAC likewise.
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "mpeg"
    raise PromptRejected("the file is not audio in a supported format", "unsupported_media_type")


# --------------------------------------------------------------------------- the isolated child


def prepare_prompt(src: str, dst: str, limits: PromptLimits) -> PromptStats:
    """Check ``src`` and write its canonical form to ``dst``, in a limited child process.

    Raises :class:`PromptRejected` with the refusal's code; ``dst`` exists only on success.
    """
    args = [sys.executable, "-m", "synth.prompt", src, dst, json.dumps(asdict(limits))]
    # One BLAS thread: the address-space limit would otherwise go on per-thread arenas.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        done = subprocess.run(args, capture_output=True, timeout=limits.timeout_seconds, env=env, check=False)
    except subprocess.TimeoutExpired:
        _remove(dst)
        raise PromptRejected(
            f"reading the file took longer than {limits.timeout_seconds:g} s", "invalid_audio"
        ) from None
    reply = _last_json_line(done.stdout)
    if reply is None or done.returncode not in (0, 3):
        _remove(dst)
        # Killed by its limits (MemoryError, SIGKILL, SIGXCPU) or crashed in a decoder.
        raise PromptRejected(
            "the file could not be decoded within the memory and time limits", "invalid_audio"
        )
    if "error" in reply:
        _remove(dst)
        raise PromptRejected(str(reply["message"]), str(reply["error"]))
    return PromptStats(**reply["stats"])


def _last_json_line(out: bytes) -> dict[str, Any] | None:
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _limit_self(limits: PromptLimits) -> None:
    import resource

    memory = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = max(1, math.ceil(limits.timeout_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _child(src: str, dst: str, limits: PromptLimits) -> PromptStats:
    with open(src, "rb") as fh:
        container = sniff_container(fh.read(16))
    from synth.audio import decode_upload

    audio, rate = decode_upload(src, limits.max_seconds, limits.max_bytes, min_rate=limits.min_rate)
    return canonicalise_to(audio, rate, container, dst, limits)


def canonicalise_to(
    audio: np.ndarray, rate: int, container: str, dst: str, limits: PromptLimits
) -> PromptStats:
    """Check decoded mono ``audio`` and write the canonical WAV to ``dst`` (atomically)."""
    import numpy as np
    import soundfile as sf
    import soxr

    if not np.isfinite(audio).all():
        raise PromptRejected("the audio holds NaN or infinite samples", "invalid_audio")
    duration = audio.size / rate
    if duration < limits.min_seconds:
        raise PromptRejected(
            f"the audio lasts {duration:.1f} s; at least {limits.min_seconds:g} s is needed",
            "audio_too_short",
        )
    peak = float(np.max(np.abs(audio)))
    clipped = float(np.mean(np.abs(audio) >= CLIP_LEVEL))
    mono = np.clip(audio, -1.0, 1.0).astype(np.float32)
    if rate != CANONICAL_RATE:
        mono = soxr.resample(mono, rate, CANONICAL_RATE).astype(np.float32)
    trimmed = trim_silence(mono, CANONICAL_RATE)
    level = speech_dbfs(trimmed, CANONICAL_RATE)
    canonical = normalise_level(trimmed, level)
    tmp = f"{dst}.part"
    sf.write(tmp, canonical, CANONICAL_RATE, format="WAV", subtype="PCM_16")
    os.replace(tmp, dst)
    return PromptStats(
        container=container,
        source_rate=rate,
        duration_seconds=round(duration, 3),
        trimmed_seconds=round(trimmed.size / CANONICAL_RATE, 3),
        peak=round(peak, 4),
        clipped_fraction=round(clipped, 6),
        speech_dbfs=round(level, 2) if math.isfinite(level) else float("-inf"),
    )


# --------------------------------------------------------------------------- levels


def _frame_db(audio: np.ndarray, rate: int, frame_seconds: float = 0.02) -> np.ndarray:
    """RMS level of consecutive frames in dBFS (-inf for digital silence)."""
    import numpy as np

    n = max(1, int(rate * frame_seconds))
    usable = (audio.size // n) * n
    if usable == 0:
        return np.array([-np.inf])
    frames = audio[:usable].reshape(-1, n).astype(np.float64)
    with np.errstate(divide="ignore"):
        db: np.ndarray = 10 * np.log10(np.mean(frames**2, axis=1))
    return db


def trim_silence(audio: np.ndarray, rate: int) -> np.ndarray:
    """``audio`` without leading/trailing frames far under the loudest, less a small margin."""
    import numpy as np

    frame = int(rate * 0.02)
    db = _frame_db(audio, rate)
    top = float(np.max(db))
    if not math.isfinite(top):
        return audio
    loud = np.flatnonzero(db > top - SILENCE_BELOW_PEAK_DB)
    margin = int(rate * TRIM_MARGIN_SECONDS)
    start = max(0, int(loud[0]) * frame - margin)
    end = min(audio.size, (int(loud[-1]) + 1) * frame + margin)
    return audio[start:end]


def speech_dbfs(audio: np.ndarray, rate: int) -> float:
    """RMS of the frames within 30 dB of the loudest (a crude speech gate), in dBFS."""
    import numpy as np

    db = _frame_db(audio, rate)
    top = float(np.max(db))
    if not math.isfinite(top):
        return float("-inf")
    active = db[db > top - 30.0]
    return float(10 * np.log10(np.mean(10 ** (active / 10))))


def normalise_level(audio: np.ndarray, level_dbfs: float) -> np.ndarray:
    """One gain to :data:`CANONICAL_SPEECH_DBFS`, lowered if the peak would pass :data:`CANONICAL_PEAK`."""
    import numpy as np

    if not math.isfinite(level_dbfs) or audio.size == 0:
        return audio.astype(np.float32)
    gain = 10 ** ((CANONICAL_SPEECH_DBFS - level_dbfs) / 20)
    peak = float(np.max(np.abs(audio)))
    if peak * gain > CANONICAL_PEAK:
        gain = CANONICAL_PEAK / peak
    out: np.ndarray = (audio * gain).astype(np.float32)
    return out


def main(argv: list[str]) -> int:
    src, dst, raw = argv
    limits = PromptLimits(**json.loads(raw))
    _limit_self(limits)
    try:
        stats = _child(src, dst, limits)
    except AudioRejected as exc:
        print(json.dumps({"error": exc.reason or exc.code, "message": exc.message}))
        return 3
    except MemoryError:
        return 4
    print(json.dumps({"stats": stats.to_json()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = [
    "CANONICAL_RATE",
    "PROMPT_MAX_SECONDS",
    "PROMPT_MIN_SECONDS",
    "UPLOAD_CODES",
    "PromptLimits",
    "PromptRejected",
    "PromptStats",
    "prepare_prompt",
    "sniff_container",
]
