"""The streaming G.711 encoders (``LiveEncoder`` for ``ulaw``/``alaw``): fed PCM in pieces, as a
stream or a realtime session feeds them, they give the source at 8 kHz, companded."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from synth import g711
from synth.audio import pcm16_samples
from webapp.speech.api.streaming import STREAMABLE, LiveEncoder


def speechlike(seconds: float, rate: int) -> np.ndarray:
    """Two partials under 3.4 kHz (telephone band), their level swelling as speech does."""
    t = np.arange(int(seconds * rate)) / rate
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 1.5 * t)
    tone = 0.5 * np.sin(2 * np.pi * 220 * t) + 0.25 * np.sin(2 * np.pi * 1330 * t)
    return (0.8 * envelope * tone).astype(np.float32)


def fed_in_pieces(encoder: LiveEncoder, pcm: bytes, piece: int) -> bytes:
    out = b"".join(encoder.feed(pcm[i : i + piece]) for i in range(0, len(pcm), piece))
    return out + encoder.finish()


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    n = min(reference.size, other.size)
    reference, other = reference[:n].astype(np.float64), other[:n].astype(np.float64)
    return float(10 * np.log10(np.sum(reference**2) / np.sum((other - reference) ** 2)))


def test_g711_formats_stream() -> None:
    assert "ulaw" in STREAMABLE and "alaw" in STREAMABLE


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 48000])
def test_live_g711_is_the_source_resampled_to_8_khz(law: str, rate: int) -> None:
    source = pcm16_samples(speechlike(1.5, rate))
    # Odd-sized pieces (a stream's 64 KB blocks, a session's frames) never split a sample here.
    out = fed_in_pieces(LiveEncoder(law, rate), source.tobytes(), 2 * 1237)
    assert abs(len(out) - 12000) <= 2  # one byte a sample at 8 kHz, whatever came in
    expected = soxr.resample(source.astype(np.float32), rate, 8000, quality="HQ")
    assert snr_db(expected, g711.decode(out, law).astype(np.float32)) > 30


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_at_8_khz_each_piece_is_companded_as_it_comes(law: str) -> None:
    source = pcm16_samples(speechlike(0.5, 8000))
    encoder = LiveEncoder(law, 8000)
    first = encoder.feed(source[:1000].tobytes())
    assert first == g711.encode(source[:1000], law)  # nothing held back: no resampler in between
    assert first + encoder.feed(source[1000:].tobytes()) + encoder.finish() == g711.encode(source, law)


def test_a_clipped_source_does_not_wrap_around() -> None:
    """soxr rings past full scale on a square wave: the samples are clipped, never wrapped."""
    square = np.where(np.sin(np.arange(24000) * 2 * np.pi * 300 / 24000) >= 0, 32767, -32768).astype("<i2")
    out = g711.decode(fed_in_pieces(LiveEncoder("ulaw", 24000), square.tobytes(), 4800), "ulaw")
    # Wrapped samples would flip sign in the middle of each half period.
    middle = g711.decode(g711.encode(square, "ulaw"), "ulaw")[::3][: out.size]
    agreeing = np.mean(np.sign(out[100:-100]) == np.sign(middle[100:-100]))
    assert agreeing > 0.95
