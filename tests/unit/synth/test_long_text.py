"""Very long texts synthesise (never refused) with flat memory.

Each measurement runs in a fresh child process, as a worker's child runs a job: the voice loaded,
a short job, then the long one. The test process's own heap (whatever the suite left in it)
decides nothing, and a leak that grows with the text still fails the bound
(``test_a_leak_that_grows_with_the_text_fails_the_bound`` plants one).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from synth import SynthesisRequest, Synthesizer

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, and every night its keeper climbed the stairs. "
    "He trimmed the wick, polished the lens and watched the ships pass in the dark. "
    "Some nights the fog rolled in so thick that he could not see the water at all! "
    "Did the sailors know how much he cared? Perhaps they did, perhaps they never thought of it. "
)
# What a long job may add to the peak of a short one, in MB.
BOUND_MB = 60


def _text(chars: int) -> str:
    return (PARAGRAPH * (chars // len(PARAGRAPH) + 1))[:chars]


def _plant_leak() -> None:
    """The fault: every sentence's audio kept for ever, as a cache that never lets go would."""
    kept: list[Any] = []
    render = Synthesizer._audio_with_gaps

    def leaking(*args: Any, **kwargs: Any) -> Any:
        for audio in render(*args, **kwargs):
            kept.append(audio.copy())
            yield audio

    Synthesizer._audio_with_gaps = staticmethod(leaking)  # type: ignore[method-assign,assignment]


def _measure(voice: str, chars: int, leak: bool, fields: dict[str, Any]) -> tuple[float, float, float]:
    """In the child: (peak RSS of a 2,000-character job, of the long one, the long one's seconds)."""
    if leak:
        _plant_leak()
    synthesizer = Synthesizer(device="cpu", threads=min(2, os.cpu_count() or 1))
    synthesizer.load([voice])
    with tempfile.TemporaryDirectory() as tmp:
        peaks = []
        for n in (2000, chars):
            request = SynthesisRequest(_text(n), voice=voice, format="pcm", sample_rate=8000, **fields)
            result = synthesizer.synthesize(request, str(Path(tmp) / f"{n}.pcm"))
            peaks.append(result.peak_rss_mb)
    return peaks[0], peaks[1], result.duration_seconds


def growth(voice: str, chars: int, *, leak: bool = False, **fields: Any) -> tuple[float, float]:
    """(MB the long job added to the short one's peak, its audio seconds), in a fresh child."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        base, peak, seconds = pool.apply(_measure, (voice, chars, leak, fields))
    return peak - base, seconds


@pytest.mark.slow
def test_espeak_200k_characters_flat_memory() -> None:
    added, seconds = growth("espeak-en-us", 200_000)
    assert seconds > 2 * 3600  # hours of audio: holding it would need > 600 MB
    assert added < BOUND_MB, added


@pytest.mark.slow
def test_piper_20k_characters_flat_memory() -> None:
    added, seconds = growth("en_US-joe-medium", 20_000)
    assert seconds > 900  # ~20 minutes: holding it as float32 at 22 kHz would need ~100 MB
    assert added < BOUND_MB, added


@pytest.mark.slow
def test_loudness_normalisation_keeps_memory_flat() -> None:
    added, seconds = growth("espeak-en-us", 100_000, loudness_lufs=-16.0)
    assert seconds > 3600  # an hour of audio: one float64 copy of it would be ~200 MB
    assert added < BOUND_MB, added


@pytest.mark.slow
def test_a_leak_that_grows_with_the_text_fails_the_bound() -> None:
    added, seconds = growth("espeak-en-us", 50_000, leak=True)
    assert seconds > 1800  # half an hour of audio kept: about 150 MB at 22 kHz
    assert added > BOUND_MB, added
