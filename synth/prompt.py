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

The child is also kept from everything else the service holds (:func:`sandbox_mode`):
it always starts with an empty environment (no ``DATABASE_URL`` or ``REDIS_URL``), no
inherited descriptors and Python's isolated mode, and it opens the upload with the
FFmpeg demuxer the sniffed type names, on the ``file`` protocol alone. Where the kernel
offers Landlock it then restricts itself to the Python install, the upload and the
folder it writes (the secrets and the database are out of its reach) and to no TCP;
where bubblewrap can make namespaces it runs in its own (no network, a private
``/tmp``, only those paths mounted).

Module import is light (no numpy), so the web tier can import it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synth import landlock
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
    sandbox: str = "limits"  # one of SANDBOX_MODES less "auto": what sandbox_mode() resolved
    niceness: int = 0  # how much lower than its parent's the child's CPU priority is


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
    try:
        done = run_child(["-m", "synth.prompt", src, dst, json.dumps(asdict(limits))], src, dst, limits)
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


# --------------------------------------------------------------------------- the sandbox

SANDBOX_MODES = ("auto", "bubblewrap", "landlock", "limits")
# One BLAS thread: the address-space limit would otherwise go on per-thread arenas. This is
# the child's whole environment.
_CHILD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "LC_ALL": "C.UTF-8",
}
# System folders the interpreter and the decoders' libraries are read from (bubblewrap mounts
# them read-only; Landlock lets them be read), and what of the kernel's views they read.
_SYSTEM_READ = (
    "/usr",
    "/lib",
    "/lib64",
    "/bin",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/sys/devices/system/cpu",
)
_KERNEL_READ = ("/proc", "/dev/null", "/dev/urandom")


class SandboxUnavailable(RuntimeError):
    """The sandbox asked for (``TTS_PROMPT_SANDBOX``) cannot run on this host."""


def sandbox_mode(wanted: str = "auto") -> str:
    """What confines the decode child here: ``bubblewrap`` (own namespaces, and Landlock inside
    where the kernel has it), ``landlock``, or ``limits`` (resource limits and an empty
    environment only). ``auto`` takes the first this host allows; a named mode it does not
    allow raises :class:`SandboxUnavailable`.
    """
    if wanted not in SANDBOX_MODES:
        raise SandboxUnavailable(f"unknown sandbox {wanted!r}; one of {', '.join(SANDBOX_MODES)}")
    usable = {"bubblewrap": _bubblewrap_usable(), "landlock": landlock.abi_version() >= 1, "limits": True}
    if wanted == "auto":
        return next(mode for mode, ok in usable.items() if ok)
    if not usable[wanted]:
        why = {
            "bubblewrap": "bwrap is not installed or this host refuses it user namespaces",
            "landlock": "this kernel does not offer Landlock",
        }
        raise SandboxUnavailable(f"sandbox {wanted!r} is not available here: {why[wanted]}")
    return wanted


@functools.cache
def _bubblewrap_usable() -> bool:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    try:
        done = subprocess.run(
            [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def python_paths() -> list[Path]:
    """What this interpreter reads to run ``python -I -m synth...``: its installs and synth
    itself (never the checkout as a whole, which holds var/)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(p for p in sys.path if os.path.isabs(p))}
    return sorted({Path(p) for p in roots} | {Path(__file__).resolve().parent})


def run_child(
    entry: list[str],
    src: str,
    dst: str,
    limits: PromptLimits,
    extra_read: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[bytes]:
    """``python -I ENTRY...`` under ``limits.sandbox``, reading ``src`` and writing beside ``dst``.

    ``entry`` is ``["-m", module, args...]`` or a script and its arguments; under bubblewrap only
    the paths the child needs are mounted (``extra_read`` adds some, read-only).
    """
    argv = [sys.executable, "-I", *entry]
    if limits.sandbox == "bubblewrap":
        argv = _bubblewrap_argv(src, dst, extra_read) + argv
    if limits.niceness > 0:
        # From its first instruction (its start-up costs CPU too), and only the child: the
        # parent's own priority stays as it is.
        argv = [shutil.which("nice") or "nice", "-n", str(limits.niceness), *argv]
    return subprocess.run(
        argv,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=limits.timeout_seconds,
        env=dict(_CHILD_ENV),
        cwd="/",
        close_fds=True,
        check=False,
    )


def _bubblewrap_argv(src: str, dst: str, extra_read: tuple[str, ...]) -> list[str]:
    bwrap = shutil.which("bwrap") or "bwrap"
    out_dir = os.path.dirname(os.path.abspath(dst))
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    for name, value in _CHILD_ENV.items():
        argv += ["--setenv", name, value]
    # The private /tmp first: a mount made after it may lie beneath it (a checkout, a venv or an
    # upload under /tmp), one made before would be hidden by it.
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in [*_SYSTEM_READ, *map(str, python_paths()), *extra_read]:
        argv += ["--ro-bind-try", path, path]
    argv += ["--ro-bind", src, src, "--bind", out_dir, out_dir]
    return [*argv, "--chdir", "/", "--"]


def confine(src: str, dst: str, limits: PromptLimits) -> str:
    """In the child, before any decoder is imported: resource limits, then Landlock where the
    mode has it. Returns what was applied, for the log."""
    _limit_self(limits)
    if limits.sandbox in ("landlock", "bubblewrap") and landlock.abi_version() >= 1:
        read = [*python_paths(), *map(Path, _SYSTEM_READ + _KERNEL_READ), Path(src)]
        abi = landlock.restrict_self(read, [Path(os.path.dirname(os.path.abspath(dst)))])
        return f"{limits.sandbox}, landlock abi {abi}"
    return limits.sandbox


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

    audio, rate = decode_upload(
        src, limits.max_seconds, limits.max_bytes, min_rate=limits.min_rate, container=container
    )
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
    confine(src, dst, limits)
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
    "SANDBOX_MODES",
    "SandboxUnavailable",
    "confine",
    "prepare_prompt",
    "run_child",
    "sandbox_mode",
    "sniff_container",
]
