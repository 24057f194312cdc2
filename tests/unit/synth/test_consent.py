"""synth.consent on real speech: flite reads the consent phrase (issue 52)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from synth import consent
from tests import prompt_files as pf

CODE = "471903"
ORGANIZATION = "Acme Corporation"


def _spoken(code: str) -> str:
    return " ".join(consent.DIGIT_WORDS[int(d)] for d in code)


def _reading(voice: str, path: Path, code: str) -> tuple[np.ndarray, int]:
    """flite's ``voice`` reading the phrase, the code spoken digit by digit as ``code``."""
    text = consent.consent_phrase("en", ORGANIZATION, code).replace(" ".join(code), _spoken(code))
    audio, rate = sf.read(pf.flite(voice, path, text), dtype="float32")
    return audio, int(rate)


@pytest.fixture(scope="module")
def phrase() -> str:
    return consent.consent_phrase("en", ORGANIZATION, CODE)


@pytest.fixture(scope="module")
def slt_right(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, int]:
    return _reading("slt", tmp_path_factory.mktemp("consent") / "slt.wav", CODE)


def test_phrase_names_the_organization_and_spells_the_code(phrase: str) -> None:
    assert "Acme Corporation" in phrase
    assert phrase.endswith("My code is 4 7 1 9 0 3.")


def test_phrase_in_another_language_is_unsupported() -> None:
    with pytest.raises(consent.Unsupported):
        consent.consent_phrase("de", ORGANIZATION, CODE)


def test_new_code_is_six_digits() -> None:
    code = consent.new_code()
    assert len(code) == 6 and code.isdigit()


def test_right_code_read_by_flite_passes(slt_right: tuple[np.ndarray, int], phrase: str) -> None:
    verdict = consent.check_words(*slt_right, phrase, CODE)
    assert verdict == consent.WordsVerdict(True, CODE, "", verdict.margin, verdict.speech_seconds)


def test_right_code_at_44_khz_stereo_passes(slt_right: tuple[np.ndarray, int], phrase: str) -> None:
    from scipy.signal import resample_poly

    audio, rate = slt_right
    upsampled = resample_poly(audio, 441, 160).astype(np.float32)
    stereo = np.stack([upsampled, upsampled], axis=1)
    assert consent.check_words(stereo, 44100, phrase, CODE).passed


def test_one_digit_wrong_code_is_a_mismatch(tmp_path: Path, phrase: str) -> None:
    wrong = "471904"
    verdict = consent.check_words(*_reading("rms", tmp_path / "rms.wav", wrong), phrase, CODE)
    assert (verdict.passed, verdict.reason, verdict.heard_code) == (False, consent.MISMATCH, wrong)


def test_another_sentence_with_the_right_code_is_a_mismatch(tmp_path: Path, phrase: str) -> None:
    path = pf.flite(
        "slt", tmp_path / "other.wav", f"Please call Stella tomorrow. My code is {_spoken(CODE)}."
    )
    audio, rate = sf.read(path, dtype="float32")
    verdict = consent.check_words(audio, int(rate), phrase, CODE)
    assert (verdict.passed, verdict.reason) == (False, consent.MISMATCH)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.zeros(8 * 16000, dtype=np.float32),
        lambda: np.random.default_rng(1).normal(0, 0.1, 8 * 16000).astype(np.float32),
    ],
    ids=["silence", "white_noise"],
)
def test_silence_or_noise_is_unclear(make: object, phrase: str) -> None:
    assert callable(make)
    verdict = consent.check_words(make(), 16000, phrase, CODE)
    assert (verdict.passed, verdict.reason, verdict.heard_code) == (False, consent.UNCLEAR, None)


def test_rate_below_16_khz_is_refused(slt_right: tuple[np.ndarray, int], phrase: str) -> None:
    audio, _ = slt_right
    with pytest.raises(ValueError, match="sample_rate_too_low"):
        consent.check_words(audio[::2], 8000, phrase, CODE)


@pytest.mark.slow  # loads the speaker encoder (torch): make test runs it, make test-fast leaves it out
def test_two_flite_voices_are_below_the_threshold(tmp_path: Path, slt_right: tuple[np.ndarray, int]) -> None:
    from synth.speaker import embed

    awb, rate = sf.read(pf.flite("awb", tmp_path / "awb.wav"), dtype="float32")
    score = consent.speaker_similarity(embed(*slt_right), embed(awb, int(rate)))
    assert score < consent.SAME_SPEAKER_THRESHOLD


@pytest.mark.slow  # loads the speaker encoder (torch): make test runs it, make test-fast leaves it out
def test_same_voice_two_sentences_is_above_the_threshold(
    tmp_path: Path, slt_right: tuple[np.ndarray, int]
) -> None:
    from synth.speaker import embed

    prompt, rate = sf.read(pf.flite("slt", tmp_path / "prompt.wav"), dtype="float32")
    score = consent.speaker_similarity(embed(*slt_right), embed(prompt, int(rate)))
    assert score >= consent.SAME_SPEAKER_THRESHOLD
