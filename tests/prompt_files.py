"""Real voice-prompt files, good and bad, for the prompt tests (unit and API).

Good prompts are real speech from Debian's ``flite`` (voices built from
recordings of real speakers); each bad file breaks exactly one limit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

PROMPT_SENTENCE = "Please call Stella and ask her to bring these things with her from the store, six spoons of fresh snow peas."
RATE = 16000


def flite(voice: str, path: Path, text: str = PROMPT_SENTENCE) -> Path:
    """``text`` spoken by flite's ``voice`` (awb, rms, slt) as a 16 kHz WAV."""
    if shutil.which("flite") is None:
        pytest.skip("Debian's flite is not installed (deploy/bootstrap.sh installs it)")
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(path)], check=True, timeout=60)
    return path


def read_aloud(voice: str, path: Path, text: str) -> Path:
    """``text`` read by flite's ``voice`` the way a person reads a code: a pause after each digit.

    Run together ("three four five"), flite's digits were misheard by pocketsphinx in 2 of 210
    random codes (a 4 heard as a 5), with the pauses in 2 of 400 (a 2 heard as a 0): the tests
    that record also fix their codes (tests/conftest.py, ``recognised_consent_codes``).
    """
    return flite(voice, path, re.sub(r"(?<=\b\d) (?=\d\b)", ", ", text))


def speech(tmp: Path) -> tuple[np.ndarray, int]:
    """About 6 s of real speech as float samples (slt)."""
    audio, rate = sf.read(flite("slt", tmp / "speech-src.wav"), dtype="float32")
    return audio, int(rate)


def tone(seconds: float, rate: int = RATE, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def write(path: Path, audio: np.ndarray, rate: int = RATE, subtype: str = "PCM_16") -> Path:
    sf.write(str(path), audio, rate, subtype=subtype)
    return path


def nan_float_wav(path: Path) -> Path:
    audio = tone(5.0)
    audio[::500] = np.nan
    return write(path, audio, subtype="FLOAT")


def flac_claiming_2_32_frames(path: Path, source: Path) -> Path:
    """A small, valid FLAC whose STREAMINFO says it holds 2**32 frames (about 75 hours at 16 kHz)."""
    audio, rate = sf.read(str(source), dtype="float32")
    flac = path.with_suffix(".tmp.flac")
    sf.write(str(flac), audio, rate, format="FLAC")
    data = bytearray(flac.read_bytes())
    assert data[:4] == b"fLaC"
    total = 2**32
    info = 8  # STREAMINFO body: total samples are 36 bits from its byte 13 (low nibble)
    data[info + 13] = (data[info + 13] & 0xF0) | ((total >> 32) & 0x0F)
    data[info + 14 : info + 18] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    flac.unlink()
    return path


def renamed_text_file(path: Path) -> Path:
    path.write_text("This is a text file with a .wav name.\n" * 200)
    return path


def truncated_header(path: Path, source: Path) -> Path:
    path.write_bytes(source.read_bytes()[:30])  # RIFF/WAVE, then the fmt chunk cut off
    return path


def eight_khz(path: Path, audio: np.ndarray, rate: int) -> Path:
    import soxr

    return write(path, soxr.resample(audio, rate, 8000), 8000)


def silence(path: Path) -> Path:
    return write(path, np.zeros(RATE * 5, dtype=np.float32))


def noise(path: Path) -> Path:
    rng = np.random.default_rng(7)
    return write(path, (rng.standard_normal(RATE * 5) * 0.1).astype(np.float32))


def clipped(path: Path, audio: np.ndarray, rate: int) -> Path:
    """The speech driven 20 dB into full scale: a large share of samples clip."""
    return write(path, np.clip(audio * 10.0, -1.0, 1.0), rate)


def very_quiet(path: Path, audio: np.ndarray, rate: int) -> Path:
    """The speech 60 dB down, in 24-bit so it survives as (very quiet) speech."""
    return write(path, audio * 0.001, rate, subtype="PCM_24")
