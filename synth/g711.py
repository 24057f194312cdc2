"""G.711 companding: 16-bit linear PCM to μ-law or A-law bytes and back, in numpy.

Telephony (Twilio media streams, SIP trunks, ElevenLabs' ``ulaw_8000``) carries speech as 8 kHz
mono G.711: one byte a sample, no header. The encoders follow ITU-T G.711 as its reference code
in ITU-T G.191 (``g711.c``) implements it: a negative sample is taken as its one's complement
before the shift (so -1 is "negative zero", μ-law 0x7F), μ-law clips the 14-bit magnitude plus
its bias of 33 at 8191, A-law encodes a 13-bit value and inverts its even bits (0x55). The
decoders give the standard's reconstruction values scaled to 16 bits (μ-law up to ±32124, A-law
up to ±32256). Python's ``audioop`` did this, but it is deprecated and gone in Python 3.13.

Both directions are table look-ups: the encoders' tables cover every int16 value (64 KiB each),
built on first use, so encoding is one index per sample.
"""

from __future__ import annotations

from functools import cache

import numpy as np

LAWS = ("ulaw", "alaw")
RATE = 8000  # G.711's sampling rate: the only one its formats are sent at


def _check(law: str) -> None:
    if law not in LAWS:
        raise ValueError(f"unknown G.711 law {law!r}; use one of {', '.join(LAWS)}")


@cache
def _ulaw_table() -> np.ndarray:
    """μ-law byte for every int16 value, indexed by the value as uint16 (G.191 ``ulaw_compress``)."""
    x = np.arange(-32768, 32768, dtype=np.int32)
    magnitude = np.where(x < 0, ~x, x) >> 2  # one's complement: -1 and 0 share a magnitude
    magnitude = np.minimum(magnitude + 33, 0x1FFF)
    # The segment is one more than the bit length of magnitude >> 6 (0..127): 1..8.
    segment = np.array([i.bit_length() + 1 for i in range(128)], dtype=np.int32)[magnitude >> 6]
    low = 0xF - ((magnitude >> segment) & 0xF)
    code = ((8 - segment) << 4) | low
    code = np.where(x >= 0, code | 0x80, code)
    return _by_uint16(code)


@cache
def _alaw_table() -> np.ndarray:
    """A-law byte for every int16 value, indexed by the value as uint16 (G.191 ``alaw_compress``)."""
    x = np.arange(-32768, 32768, dtype=np.int32)
    magnitude = np.where(x < 0, ~x, x) >> 4  # 12 bits of magnitude, one's complement as above
    # Segment 0 and 1 share the step; above, each segment doubles it: the exponent is where the
    # leading one sits (bit 4 -> 1 ... bit 10 -> 7), the mantissa the four bits below it.
    exponent = np.zeros_like(magnitude)
    big = magnitude > 15
    bits = np.array([i.bit_length() for i in range(2048)], dtype=np.int32)[magnitude]
    exponent[big] = bits[big] - 4
    mantissa = np.where(big, (magnitude >> np.maximum(exponent - 1, 0)) & 0xF, magnitude)
    code = (exponent << 4) | mantissa
    code = np.where(x >= 0, code | 0x80, code) ^ 0x55
    return _by_uint16(code)


def _by_uint16(codes_from_minus_32768: np.ndarray) -> np.ndarray:
    """Reorder a table built for -32768..32767 so that int16 samples viewed as uint16 index it."""
    return np.roll(codes_from_minus_32768.astype(np.uint8), -32768)


@cache
def _ulaw_decode_table() -> np.ndarray:
    """The 16-bit value of every μ-law byte (G.191 ``ulaw_expand``)."""
    y = np.arange(256, dtype=np.int32)
    inverted = ~y & 0xFF
    exponent = (inverted >> 4) & 0x7
    mantissa = inverted & 0xF
    step = 4 << (exponent + 1)
    magnitude = (0x80 << exponent) + step * mantissa + step // 2 - 4 * 33
    return np.where(y < 0x80, -magnitude, magnitude).astype(np.int16)


@cache
def _alaw_decode_table() -> np.ndarray:
    """The 16-bit value of every A-law byte (G.191 ``alaw_expand``); A-law has no zero (±8)."""
    y = np.arange(256, dtype=np.int32)
    bits = (y ^ 0x55) & 0x7F
    exponent = bits >> 4
    mantissa = (bits & 0xF) + np.where(exponent > 0, 16, 0)
    magnitude = ((mantissa << 4) + 8) << np.maximum(exponent - 1, 0)
    return np.where(y > 0x7F, magnitude, -magnitude).astype(np.int16)


def encode(pcm16: np.ndarray | bytes, law: str) -> bytes:
    """16-bit little-endian PCM (an int16 array or its bytes) as G.711 ``law`` bytes, one per sample."""
    _check(law)
    samples = np.frombuffer(pcm16, dtype="<i2") if isinstance(pcm16, bytes | bytearray) else pcm16
    index = np.asarray(samples, dtype="<i2").view(np.uint16)
    table = _ulaw_table() if law == "ulaw" else _alaw_table()
    return bytes(table[index].tobytes())


def decode(data: bytes, law: str) -> np.ndarray:
    """G.711 ``law`` bytes as int16 samples (the standard's reconstruction values)."""
    _check(law)
    table = _ulaw_decode_table() if law == "ulaw" else _alaw_decode_table()
    return table[np.frombuffer(data, dtype=np.uint8)]


__all__ = ["LAWS", "RATE", "decode", "encode"]
