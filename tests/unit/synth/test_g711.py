"""synth.g711 against ITU-T G.711's values (as the reference code of ITU-T G.191 computes them)."""

from __future__ import annotations

import numpy as np
import pytest

from synth import g711

EVERY_SAMPLE = np.arange(-32768, 32768, dtype=np.int16)


def codes(samples: list[int], law: str) -> list[int]:
    return list(g711.encode(np.array(samples, dtype=np.int16), law))


def test_known_ulaw_codes() -> None:
    # Zero is 0xFF (all bits inverted), -1 the "negative zero" 0x7F; full scale 0x80 and 0x00.
    assert codes([0, -1, 32767, -32768], "ulaw") == [0xFF, 0x7F, 0x80, 0x00]
    # Segment 0 ends where the biased 14-bit magnitude reaches 64: 16-bit 0..123 is 0xFF..0xF0.
    assert codes([4 * 30, 4 * 31], "ulaw") == [0xF0, 0xEF]
    # Clipping: past the top decision value every sample is the last code.
    assert codes([32124, 32700, 32767], "ulaw") == [0x80, 0x80, 0x80]


def test_known_alaw_codes() -> None:
    # A-law inverts the even bits: zero is 0xD5, -1 is 0x55; full scale 0xAA and 0x2A.
    assert codes([0, -1, 32767, -32768], "alaw") == [0xD5, 0x55, 0xAA, 0x2A]
    # Segments 0 and 1 share their step (16 in 16-bit units): 255 is the last of segment 0.
    assert codes([255, 256], "alaw") == [0x8F ^ 0x55, 0x90 ^ 0x55]


def test_known_reconstruction_values() -> None:
    ulaw = g711.decode(bytes([0xFF, 0x7F, 0x80, 0x00, 0xFE]), "ulaw").tolist()
    assert ulaw == [0, 0, 32124, -32124, 8]
    alaw = g711.decode(bytes([0xD5, 0x55, 0xAA, 0x2A]), "alaw").tolist()
    assert alaw == [8, -8, 32256, -32256]  # A-law has no zero: the smallest step's middle


@pytest.mark.parametrize("law", g711.LAWS)
def test_every_code_decodes_to_a_value_that_encodes_back_to_it(law: str) -> None:
    every_code = bytes(range(256))
    again = g711.encode(g711.decode(every_code, law), law)
    differ = [c for c, d in zip(every_code, again, strict=True) if c != d]
    # μ-law's negative zero decodes to 0, which is (positive) zero's code.
    assert differ == ([0x7F] if law == "ulaw" else [])


@pytest.mark.parametrize(("law", "top"), [("ulaw", 32124), ("alaw", 32256)])
def test_round_trip_is_monotonic_and_within_half_a_step(law: str, top: int) -> None:
    decoded = g711.decode(g711.encode(EVERY_SAMPLE, law), law).astype(np.int64)
    assert np.all(np.diff(decoded) >= 0)  # a louder sample never comes back quieter
    x = EVERY_SAMPLE.astype(np.int64)
    inside = np.abs(x) <= top
    error = np.abs(decoded - x)[inside]
    small = np.abs(x[inside]) <= 256
    assert error[small].max() <= 8  # the smallest steps are 8 (μ-law) and 16 (A-law) wide
    # Logarithmic: each segment's half step is under 1/20 of the smallest value it codes.
    assert (error[~small] / np.abs(x[inside][~small])).max() < 1 / 20


@pytest.mark.parametrize("law", g711.LAWS)
def test_a_tone_comes_back_at_telephone_quality(law: str) -> None:
    t = np.arange(8000) / 8000
    for amplitude in (16000, 1000):  # companding keeps the SNR about level over 24 dB
        tone = (np.sin(2 * np.pi * 440 * t) * amplitude).astype(np.int16)
        back = g711.decode(g711.encode(tone.tobytes(), law), law).astype(np.float64)
        noise = np.sum((back - tone) ** 2)
        assert 10 * np.log10(np.sum(tone.astype(np.float64) ** 2) / noise) > 33


def test_bytes_and_arrays_encode_alike_and_unknown_laws_are_refused() -> None:
    tone = (np.sin(np.arange(100) / 5) * 20000).astype(np.int16)
    assert g711.encode(tone, "ulaw") == g711.encode(tone.tobytes(), "ulaw")
    assert len(g711.encode(tone, "alaw")) == tone.size
    with pytest.raises(ValueError, match="unknown G.711 law"):
        g711.encode(tone, "g722")
    with pytest.raises(ValueError, match="unknown G.711 law"):
        g711.decode(b"\x00", "pcm")
