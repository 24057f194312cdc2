"""Speaker analysis of canonical prompts: voice activity, embedding, pitch, closest voice.

Runs on the analysis worker only: the embedding is Resemblyzer's voice encoder
(torch, CPU; its weights ship in the wheel). Input is always the canonical form
synth.prompt wrote (mono, 16 kHz, trimmed, level-normalised), so nothing here
reads untrusted bytes.

``approximate`` cloning is the built-in voice whose embedding is closest to the
prompt's, pitch-shifted towards the prompt's median F0. The candidates'
profiles come from synthesising :data:`REFERENCE_TEXT` once per voice and are
cached in a JSON file.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from synth.prompt import CANONICAL_RATE, PromptStats

if TYPE_CHECKING:
    import numpy as np

# Analysis refusals (the voice ends ``rejected`` with one of these).
MIN_SPEECH_SECONDS = 1.5
MAX_CLIPPED_FRACTION = 0.001  # 0.1 % of samples at full scale: audibly distorted
MIN_SPEECH_DBFS = -50.0  # speech this quiet is mostly the noise floor after gain
VAD_AGGRESSIVENESS = 3
MIN_PITCH_SPREAD = 1.03  # 90th/10th percentile F0: speech varies by more than half a semitone
PITCH_FMIN, PITCH_FMAX = 60.0, 400.0
PITCH_SHIFT_LIMIT = 12.0  # semitones, the engines' pitch range
REFERENCE_TEXT = (
    "The morning train was late again, so we walked along the river instead. "
    "Nobody expected the weather to change so quickly, but by noon the sky was clear and bright."
)
PROFILE_VERSION = 1
SynthesizeFn = Callable[[str, str], tuple["np.ndarray", int]]  # (voice id, text) -> (audio, rate)


@dataclass(frozen=True)
class SpeakerProfile:
    embedding: list[float]
    median_f0: float | None  # Hz; None when no voiced frame was found
    f0_low: float | None  # 10th percentile
    f0_high: float | None  # 90th percentile
    speech_seconds: float


@dataclass(frozen=True)
class ClosestVoice:
    voice_id: str
    similarity: float
    pitch_shift: float  # semitones to apply to that voice


def rejection(stats: PromptStats, speaker: SpeakerProfile) -> tuple[str, str] | None:
    """``(code, reason)`` when the prompt cannot serve as a voice, else None."""
    if stats.clipped_fraction > MAX_CLIPPED_FRACTION:
        return "clipped_audio", (
            f"{stats.clipped_fraction:.1%} of the samples are clipped at full scale; record at a lower level"
        )
    if speaker.speech_seconds < MIN_SPEECH_SECONDS:
        return "no_speech", (
            f"found {speaker.speech_seconds:.1f} s of speech; at least {MIN_SPEECH_SECONDS:g} s is needed"
        )
    if speaker.f0_low and speaker.f0_high and speaker.f0_high / speaker.f0_low < MIN_PITCH_SPREAD:
        return "no_speech", "the recording is a steady tone, not speech"
    if stats.speech_dbfs < MIN_SPEECH_DBFS:
        return "too_quiet", f"the recording level is {stats.speech_dbfs:.0f} dBFS; record closer or louder"
    return None


def speech_mask(audio: np.ndarray, rate: int = CANONICAL_RATE, frame_ms: int = 30) -> np.ndarray:
    """One bool per ``frame_ms`` frame: webrtcvad's verdict."""
    import warnings

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webrtcvad's "pkg_resources is deprecated"
        import webrtcvad

    vad = webrtcvad.Vad(VAD_AGGRESSIVENESS)
    n = rate * frame_ms // 1000
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    count = pcm.size // n
    return np.array(
        [vad.is_speech(pcm[i * n : (i + 1) * n].tobytes(), rate) for i in range(count)], dtype=bool
    )


def speech_seconds(audio: np.ndarray, rate: int = CANONICAL_RATE) -> float:
    return float(speech_mask(audio, rate).sum() * 0.03)


def pitch_track(audio: np.ndarray, rate: int = CANONICAL_RATE) -> tuple[np.ndarray, float]:
    """F0 (Hz) of the voiced frames (probabilistic YIN) and the voiced duration in seconds."""
    import librosa
    import numpy as np

    hop = 256
    f0, voiced, _ = librosa.pyin(
        audio.astype(np.float32), fmin=PITCH_FMIN, fmax=PITCH_FMAX, sr=rate, frame_length=1024, hop_length=hop
    )
    values: np.ndarray = f0[voiced & np.isfinite(f0)]
    return values, float(voiced.sum() * hop / rate)


def pitch_stats(f0: np.ndarray) -> tuple[float | None, float | None, float | None]:
    """Median, 10th and 90th percentile of an F0 track (None when too little was voiced)."""
    import numpy as np

    if f0.size < 5:
        return None, None, None
    low, mid, high = np.percentile(f0, [10, 50, 90])
    return round(float(mid), 1), round(float(low), 1), round(float(high), 1)


_ENCODER: Any = None
_ENCODER_LOCK = threading.Lock()


def _encoder() -> Any:
    global _ENCODER
    with _ENCODER_LOCK:
        if _ENCODER is None:
            from resemblyzer import VoiceEncoder

            _ENCODER = VoiceEncoder("cpu", verbose=False)
        return _ENCODER


def embed(audio: np.ndarray, rate: int = CANONICAL_RATE) -> list[float]:
    """The speaker embedding (256 floats, unit length) of speech at ``rate``."""
    import numpy as np
    import soxr

    wav = audio.astype(np.float32)
    if rate != CANONICAL_RATE:
        wav = soxr.resample(wav, rate, CANONICAL_RATE).astype(np.float32)
    vector = _encoder().embed_utterance(wav)
    return [round(float(x), 6) for x in vector]


def profile(audio: np.ndarray, rate: int = CANONICAL_RATE) -> SpeakerProfile:
    import numpy as np
    import soxr

    wav = audio.astype(np.float32)
    if rate != CANONICAL_RATE:
        wav = soxr.resample(wav, rate, CANONICAL_RATE).astype(np.float32)
    f0, voiced_seconds = pitch_track(wav)
    median, low, high = pitch_stats(f0)
    # Voice activity alone calls steady noise speech; voicing alone calls a hum speech.
    speech = min(voiced_seconds, speech_seconds(wav))
    return SpeakerProfile(embed(wav), median, low, high, round(speech, 2))


def similarity(a: Iterable[float], b: Iterable[float]) -> float:
    """Cosine similarity of two embeddings."""
    import numpy as np

    x, y = np.asarray(list(a), dtype=np.float64), np.asarray(list(b), dtype=np.float64)
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / denom) if denom else 0.0


def semitones_between(source_hz: float | None, target_hz: float | None) -> float:
    """Shift (semitones) that moves ``source_hz`` to ``target_hz``, within the engines' range."""
    if not source_hz or not target_hz:
        return 0.0
    shift = 12.0 * math.log2(target_hz / source_hz)
    return round(max(-PITCH_SHIFT_LIMIT, min(PITCH_SHIFT_LIMIT, shift)), 2)


def closest_voice(prompt: SpeakerProfile, candidates: dict[str, SpeakerProfile]) -> ClosestVoice:
    """The candidate whose embedding is nearest the prompt's, and the pitch shift towards the prompt."""
    if not candidates:
        raise ValueError("no candidate voices")
    scored = sorted(
        ((similarity(prompt.embedding, p.embedding), vid) for vid, p in candidates.items()), reverse=True
    )
    best, voice_id = scored[0]
    shift = semitones_between(candidates[voice_id].median_f0, prompt.median_f0)
    return ClosestVoice(voice_id, round(best, 4), shift)


SHIFT_STEPS = (0.0, 0.25, 0.5, 0.75, 1.0)  # fractions of the F0 distance tried by approximate_voice


def approximate_voice(
    prompt: SpeakerProfile,
    candidates: dict[str, SpeakerProfile],
    synthesize_at: Callable[[float], SynthesizeFn],
) -> ClosestVoice:
    """The closest voice, with the pitch shift (a fraction of the F0 distance) that sounds most like the prompt.

    Shifting by resampling moves the formants with the pitch, which for a
    distant speaker can sound less like them than no shift at all
    (docs/performance.md), so the shift is measured rather than assumed: the
    reference text is spoken at each step and the embedding nearest the
    prompt's wins (no shift on a tie).
    """
    pick = closest_voice(prompt, candidates)
    best = (pick.similarity, 0.0)
    steps = sorted({round(pick.pitch_shift * f, 2) for f in SHIFT_STEPS} - {0.0}, key=abs)
    for shift in steps:
        score = similarity(prompt.embedding, embed(*synthesize_at(shift)(pick.voice_id, REFERENCE_TEXT)))
        if score > best[0]:
            best = (score, shift)
    return ClosestVoice(pick.voice_id, pick.similarity, best[1])


# --------------------------------------------------------------------------- candidate profiles


def candidate_profiles(
    voice_ids: list[str], synthesize: SynthesizeFn, cache_path: str | None = None
) -> dict[str, SpeakerProfile]:
    """Profiles of built-in voices, read from ``cache_path`` or made by synthesising the reference text."""
    cached = _read_cache(cache_path)
    missing = [v for v in voice_ids if v not in cached]
    for vid in missing:
        audio, rate = synthesize(vid, REFERENCE_TEXT)
        cached[vid] = profile(audio, rate)
    if missing and cache_path:
        _write_cache(cache_path, cached)
    return {v: cached[v] for v in voice_ids}


def _read_cache(path: str | None) -> dict[str, SpeakerProfile]:
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if data.get("version") != PROFILE_VERSION:
            return {}
        return {vid: SpeakerProfile(**p) for vid, p in data["voices"].items()}
    except (OSError, ValueError, TypeError, KeyError):
        return {}  # a damaged cache is rebuilt


def _write_cache(path: str, profiles: dict[str, SpeakerProfile]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.part"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": PROFILE_VERSION, "voices": {v: asdict(p) for v, p in profiles.items()}}, fh)
    os.replace(tmp, path)


def synthesizer_fn(synthesizer: Any, work_dir: str, pitch: float = 0.0) -> SynthesizeFn:
    """A :data:`SynthesizeFn` over a synth.Synthesizer, through a WAV file in ``work_dir``."""

    def run(voice_id: str, text: str) -> tuple[np.ndarray, int]:
        import soundfile as sf

        from synth.request import SynthesisRequest

        path = os.path.join(work_dir, f"speaker-{os.getpid()}-{threading.get_ident()}.wav")
        try:
            synthesizer.synthesize(SynthesisRequest(text=text, voice=voice_id, pitch=pitch), path)
            audio, rate = sf.read(path, dtype="float32")
        finally:
            if os.path.exists(path):
                os.remove(path)
        return audio, int(rate)

    return run


def candidate_voice_ids(voices: Iterable[Any], exclude: Iterable[str] = ()) -> list[str]:
    """Built-in voices ``approximate`` may pick: English ones (the prompts' language), less ``exclude``."""
    skip = set(exclude)
    return [v.id for v in voices if v.language.lower().startswith("en") and v.id not in skip]


__all__ = [
    "ClosestVoice",
    "approximate_voice",
    "SpeakerProfile",
    "candidate_profiles",
    "candidate_voice_ids",
    "closest_voice",
    "embed",
    "pitch_stats",
    "profile",
    "rejection",
    "semitones_between",
    "similarity",
    "speech_seconds",
    "synthesizer_fn",
]
