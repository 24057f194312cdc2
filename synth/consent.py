"""Checks of a voice-cloning consent recording (issue 52): the words, and the speaker.

The service issues a phrase (:func:`consent_phrase`) naming the tenant and
holding a random code; the owner of the voice reads it aloud and uploads the
recording. Two checks follow, both here and neither touching Django:

* :func:`check_words`: pocketsphinx (its packaged en-us model, nothing
  downloaded) decodes the recording against a grammar that is exactly the
  phrase followed by as many spoken digits as the code has. The grammar
  decides which digits were read; the consent passes only when they equal the
  code. Whether the phrase was read at all is judged by comparing the
  grammar's score with a free phone loop's on the same audio (the grammar is
  always "heard" if forced; an unrelated sentence scores far below the phone
  loop, the phrase about as well as it).
* :func:`speaker_similarity` with :data:`SAME_SPEAKER_THRESHOLD`: the cosine
  of the consent recording's speaker embedding (synth.speaker.embed,
  Resemblyzer) and the voice prompt's, tying the consent to the prompt.

Recordings below :data:`MIN_SAMPLE_RATE` are refused by the caller with
``sample_rate_too_low`` before :func:`check_words` is called (it raises
ValueError on one). Only English is checked: :func:`consent_phrase` raises
:class:`Unsupported` for other languages, and the caller then requires an
owner's attestation instead.

What these checks are worth (docs/voices.md, "Consent checks"): they deter
casual misuse. A phrase read by another cloning system passes the words check,
and the speaker check only ties the consent to the prompt, not to a person.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np

CODE_DIGITS = 6
MIN_SAMPLE_RATE = 16000  # below: the caller refuses the upload with ``sample_rate_too_low``
RECOGNITION_RATE = 16000  # what pocketsphinx's en-us model expects (mono int16)
LANGUAGES = ("en",)  # phrases the recogniser can check

# Verdict reasons (the caller's error codes).
MISMATCH = "consent_mismatch"  # the digits differ from the code, or the phrase was not read
UNCLEAR = "consent_unclear"  # no confident hypothesis: silence, noise, too little speech

# Below this much speech (frames the phone loop puts in a phone other than silence or noise)
# the recording is ``consent_unclear``: silence, noise, a cough.
MIN_SPEECH_SECONDS = 1.0
# Per speech frame, the grammar's path score minus the free phone loop's (pocketsphinx log
# units). The phrase read as issued scores about 20-30 (the phone loop pays its phone language
# model, the grammar hardly anything), an unrelated sentence forced through the grammar about 0
# or less; measured by tests/bench/bench_consent.py (docs/voices.md, "Consent checks").
MIN_PHRASE_MARGIN = 10.0

# Cosine similarity of two speaker embeddings (synth.speaker.embed) at or above which the
# consent recording counts as the voice prompt's speaker. Measured by tests/bench/bench_consent.py
# (docs/voices.md, "Consent checks"): clean recordings of one speaker scored 0.935-0.969, of two
# speakers at most 0.746; 0.85 is the middle of that gap. Through a telephone channel (8 kHz
# mu-law, 20 dB noise) the same speaker scores 0.68-0.88: most such recordings are refused.
SAME_SPEAKER_THRESHOLD = 0.85

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_WORD_DIGIT = {**{w: str(i) for i, w in enumerate(DIGIT_WORDS)}, "oh": "0"}
_FILLERS = frozenset({"<s>", "</s>", "<sil>", "[NOISE]", "[SPEECH]", "SIL", "+NSN+", "+SPN+"})
_FRAME_RATE = 100  # pocketsphinx frames per second
_SILENT_PEAK = 1e-4  # a recording whose peak is below this (-80 dBFS) is digital silence
_DITHER = 3e-4  # noise (-70 dBFS) under the peak-normalised audio: exact zeros upset the features

TEMPLATE_EN = (
    "I am the owner of this voice and I consent to {organization} using it to create a synthetic voice. "
    "My code is {digits}."
)


class Unsupported(ValueError):
    """No consent phrase the recogniser can check exists for this language (English only)."""


@dataclass(frozen=True)
class WordsVerdict:
    passed: bool
    heard_code: str | None  # the digits the grammar heard; None when nothing fitted it
    reason: str  # "" when passed, else MISMATCH or UNCLEAR
    margin: float | None = None  # score margin per speech frame (see MIN_PHRASE_MARGIN)
    speech_seconds: float = 0.0


def new_code(digits: int = CODE_DIGITS) -> str:
    """A random code of ``digits`` decimal digits (leading zeros kept), from ``secrets``."""
    return "".join(str(secrets.randbelow(10)) for _ in range(digits))


def consent_phrase(language: str, organization_name: str, code: str) -> str:
    """The sentence the owner of a voice reads: the organisation's name and the code, digit by digit.

    Raises :class:`Unsupported` for a language other than English (the
    recogniser checks English only) and ValueError for a code that is not
    :data:`CODE_DIGITS` digits or an organisation name without a letter or digit.
    """
    if language.strip().lower().replace("_", "-").split("-")[0] not in LANGUAGES:
        raise Unsupported(
            f"consent phrases are checked in English only, not {language!r}; "
            "record the English phrase or attest ownership instead"
        )
    _check_code(code)
    organization = " ".join(organization_name.split())
    if not re.search(r"\w", organization):
        raise ValueError("the organisation name has no letter or digit")
    return TEMPLATE_EN.format(organization=organization, digits=" ".join(code))


def check_words(samples: np.ndarray, rate: int, phrase: str, code: str) -> WordsVerdict:
    """Whether ``samples`` read ``phrase`` with exactly ``code`` as its digits.

    ``samples``: mono or (frames, channels), float in [-1, 1] or integer PCM.
    ``rate`` must be at least :data:`MIN_SAMPLE_RATE` (the caller refuses
    lower rates with ``sample_rate_too_low``; here it is a ValueError). The
    audio is mixed to mono and resampled to 16 kHz int16 for pocketsphinx.
    ``phrase`` is the text :func:`consent_phrase` issued (its trailing code
    digits are replaced by a digit slot each).
    """
    _check_code(code)
    if rate < MIN_SAMPLE_RATE:
        raise ValueError(f"sample_rate_too_low: {rate} Hz; consent recordings need {MIN_SAMPLE_RATE} Hz")
    pcm = _pcm16(samples, rate)
    if pcm is None or pcm.size < RECOGNITION_RATE * MIN_SPEECH_SECONDS:
        return WordsVerdict(False, None, UNCLEAR)  # digital silence, or too short
    decoder = _decoder()
    phone_score, speech_frames = _decode_phones(decoder, pcm)
    speech = speech_frames / _FRAME_RATE
    if speech < MIN_SPEECH_SECONDS:
        return WordsVerdict(False, None, UNCLEAR, None, round(speech, 2))
    words = phrase_words(phrase, code)
    _pronounce(decoder, words)
    decoder.add_jsgf_string("consent", _grammar(words, len(code)))
    decoder.activate_search("consent")
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), no_search=False, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    if hyp is None or not hyp.hypstr:
        # Speech that no path of the grammar fits to its end: something else was said.
        return WordsVerdict(False, None, MISMATCH, None, round(speech, 2))
    log = decoder.get_logmath()
    margin = (log.log(hyp.best_score) - phone_score) / max(speech_frames, 1)
    heard = "".join(_WORD_DIGIT[w] for w in hyp.hypstr.split()[len(words) :])
    if margin < MIN_PHRASE_MARGIN or heard != code:
        return WordsVerdict(False, heard, MISMATCH, round(margin, 2), round(speech, 2))
    return WordsVerdict(True, heard, "", round(margin, 2), round(speech, 2))


def speaker_similarity(a_embedding: Iterable[float], b_embedding: Iterable[float]) -> float:
    """Cosine similarity of two speaker embeddings (synth.speaker.embed); compare with
    :data:`SAME_SPEAKER_THRESHOLD`."""
    from synth.speaker import similarity

    return similarity(a_embedding, b_embedding)


def same_speaker(a_embedding: Iterable[float], b_embedding: Iterable[float]) -> bool:
    return speaker_similarity(a_embedding, b_embedding) >= SAME_SPEAKER_THRESHOLD


# --------------------------------------------------------------------------- the recogniser


def phrase_words(phrase: str, code: str) -> list[str]:
    """The grammar's words for ``phrase``: lower case, punctuation dropped, the trailing code removed."""
    tokens = re.findall(r"[a-z0-9]+(?:'[a-z]+)?", phrase.lower())
    n = len(code)
    if len(tokens) >= n and "".join(tokens[-n:]) == code:
        tokens = tokens[:-n]
    elif tokens and tokens[-1] == code:
        tokens = tokens[:-1]
    if not tokens:
        raise ValueError("the consent phrase has no words besides the code")
    return tokens


def _check_code(code: str) -> None:
    if len(code) != CODE_DIGITS or not code.isascii() or not code.isdigit():
        raise ValueError(f"the consent code must be {CODE_DIGITS} digits")


def _model_paths() -> tuple[str, str, str]:
    from pocketsphinx import get_model_path

    base = os.path.join(get_model_path(), "en-us")
    return (
        os.path.join(base, "en-us"),
        os.path.join(base, "cmudict-en-us.dict"),
        os.path.join(base, "en-us-phone.lm.bin"),
    )


def _decoder() -> Any:
    """A fresh decoder (one per check: decoders are not thread-safe, and each holds its phrase)."""
    from pocketsphinx import Decoder

    hmm, dictionary, _ = _model_paths()
    # FATAL only: a grammar that no path reaches the end of is logged as an ERROR, and that
    # is an answer here (MISMATCH), not a fault.
    return Decoder(hmm=hmm, dict=dictionary, lm=None, loglevel="FATAL")


def _decode_phones(decoder: Any, pcm: np.ndarray) -> tuple[float, int]:
    """The free phone loop's path score, and how many frames it puts in phones (not silence or noise)."""
    _, _, phone_lm = _model_paths()
    decoder.add_allphone_file("phones", phone_lm)
    decoder.activate_search("phones")
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), no_search=False, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    if hyp is None:
        return 0.0, 0
    speech = sum(s.end_frame - s.start_frame + 1 for s in decoder.seg() if s.word not in _FILLERS)
    return float(decoder.get_logmath().log(hyp.best_score)), speech


def _grammar(words: list[str], digits: int) -> str:
    slots = " ".join(["<digit>"] * digits)
    return (
        "#JSGF V1.0;\ngrammar consent;\n"
        f"<digit> = {' | '.join((*DIGIT_WORDS, 'oh'))};\n"
        f"public <consent> = {' '.join(words)} {slots};\n"
    )


def _pronounce(decoder: Any, words: list[str]) -> None:
    """Adds the words the dictionary lacks (an organisation's name, mostly), spelt by eSpeak NG."""
    for word in dict.fromkeys(words):
        if decoder.lookup_word(word) is None:
            decoder.add_word(word, " ".join(_phones_of(word)), True)


def _phones_of(word: str) -> list[str]:
    """ARPAbet phones (no stress) for a word: eSpeak NG's IPA, else one sound per letter."""
    from synth.errors import EngineUnavailable
    from synth.lexicon import RuleError, ipa_to_arpabet

    try:
        from synth.espeak_lib import get_lib

        ipa = get_lib().text_to_phonemes(word, "en-us", ipa=True)
        phones = [p.rstrip("012") for p in ipa_to_arpabet(ipa.replace("-", ""))]
    except (EngineUnavailable, RuleError, OSError):
        phones = []
    return phones or [_LETTER_PHONES[c] for c in word if c in _LETTER_PHONES] or ["AH"]


# A last resort for a word eSpeak cannot spell: one sound per letter.
_LETTER_PHONES = dict(
    zip(
        "abcdefghijklmnopqrstuvwxyz0123456789",
        "AE B K D EH F G HH IH JH K L M N AA P K R S T AH V W K Y Z Z W T TH F F S S EY N".split(),
        strict=True,
    )
)


def _pcm16(samples: np.ndarray, rate: int) -> np.ndarray | None:
    """Mono 16 kHz int16, peak-normalised and dithered; None for digital silence.

    Synthetic speech (eSpeak) holds runs of exact zeros between words, which
    pocketsphinx's features take for something else than silence: a faint,
    seeded noise floor (:data:`_DITHER`) makes them ordinary quiet.
    """
    import math

    import numpy as np
    from scipy.signal import resample_poly

    audio = np.asarray(samples)
    if np.issubdtype(audio.dtype, np.integer):
        audio = audio.astype(np.float64) / float(np.iinfo(audio.dtype).max)
    else:
        audio = np.nan_to_num(audio.astype(np.float64))
    if audio.ndim == 2:
        audio = audio.mean(axis=1)
    if rate != RECOGNITION_RATE:
        g = math.gcd(rate, RECOGNITION_RATE)
        audio = resample_poly(audio, RECOGNITION_RATE // g, rate // g)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < _SILENT_PEAK:
        return None
    audio = audio * (0.7 / peak) + np.random.default_rng(0).normal(0.0, _DITHER, audio.size)
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")


__all__ = [
    "CODE_DIGITS",
    "MIN_SAMPLE_RATE",
    "MISMATCH",
    "SAME_SPEAKER_THRESHOLD",
    "UNCLEAR",
    "Unsupported",
    "WordsVerdict",
    "check_words",
    "consent_phrase",
    "new_code",
    "phrase_words",
    "same_speaker",
    "speaker_similarity",
]
