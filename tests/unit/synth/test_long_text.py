"""Very long texts synthesise (never refused) with flat memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth import SynthesisRequest, Synthesizer

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, and every night its keeper climbed the stairs. "
    "He trimmed the wick, polished the lens and watched the ships pass in the dark. "
    "Some nights the fog rolled in so thick that he could not see the water at all! "
    "Did the sailors know how much he cared? Perhaps they did, perhaps they never thought of it. "
)


def _text(chars: int) -> str:
    return (PARAGRAPH * (chars // len(PARAGRAPH) + 1))[:chars]


def _baseline(s: Synthesizer, tmp: Path, voice: str) -> float:
    res = s.synthesize(
        SynthesisRequest(_text(2000), voice=voice, format="pcm", sample_rate=8000), str(tmp / "base.pcm")
    )
    return res.peak_rss_mb


@pytest.mark.slow
def test_espeak_200k_characters_flat_memory(synthesizer: Synthesizer, tmp_path: Path) -> None:
    base = _baseline(synthesizer, tmp_path, "espeak-en-us")
    res = synthesizer.synthesize(
        SynthesisRequest(_text(200_000), voice="espeak-en-us", format="pcm", sample_rate=8000),
        str(tmp_path / "long.pcm"),
    )
    assert res.duration_seconds > 2 * 3600  # hours of audio: holding it would need > 600 MB
    assert res.peak_rss_mb - base < 60, (base, res.peak_rss_mb)


@pytest.mark.slow
def test_piper_20k_characters_flat_memory(synthesizer: Synthesizer, tmp_path: Path) -> None:
    base = _baseline(synthesizer, tmp_path, "en_US-joe-medium")
    res = synthesizer.synthesize(
        SynthesisRequest(_text(20_000), format="pcm", sample_rate=8000), str(tmp_path / "long.pcm")
    )
    assert res.duration_seconds > 900  # ~20 minutes: holding it as float32 at 22 kHz would need ~100 MB
    assert res.peak_rss_mb - base < 60, (base, res.peak_rss_mb)


@pytest.mark.slow
def test_loudness_normalisation_keeps_memory_flat(synthesizer: Synthesizer, tmp_path: Path) -> None:
    def peak(chars: int) -> tuple[float, float]:
        request = SynthesisRequest(
            _text(chars), voice="espeak-en-us", format="pcm", sample_rate=8000, loudness_lufs=-16.0
        )
        res = synthesizer.synthesize(request, str(tmp_path / f"{chars}.pcm"))
        return res.peak_rss_mb, res.duration_seconds

    base, _ = peak(2000)
    long_peak, seconds = peak(100_000)
    assert seconds > 3600  # an hour of audio: one float64 copy of it would be ~200 MB
    assert long_peak - base < 60, (base, long_peak)
