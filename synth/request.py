"""What a synthesis request asks for, and how it becomes engine controls.

Validation needs no engine (the web tier and workers both call
:func:`validate_request`); :func:`plan_controls` merges the request with its
style instructions into the absolute :class:`VoiceParams` one engine call
takes, and says what was applied and what could not be.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from synth.engines.base import VoiceParams, VoicePrompt
from synth.errors import EngineUnavailable, InvalidText, UnsupportedControl, UnsupportedFormat
from synth.instructions import Instructions, parse_instructions
from synth.lexicon import Lexicon
from synth.registry import (
    DEFAULT_VOICE,
    FORMATS,
    LOUDNESS_RANGE,
    NOISE_RANGE,
    PITCH_RANGE,
    SEED_RANGE,
    SENTENCE_SILENCE_RANGE,
    SPEED_RANGE,
    VOLUME_RANGE,
    VoiceInfo,
    espeak_voice_for_language,
)
from synth.text import validate_text

DEFAULT_SENTENCE_SILENCE = 0.2  # seconds between sentence chunks
MAX_INSTRUCTIONS_CHARS = 500


@dataclass
class SynthesisRequest:
    text: str
    voice: str = DEFAULT_VOICE
    format: str = "wav"
    sample_rate: int | None = None
    speed: float = 1.0
    pitch: float = 0.0
    volume: float = 0.0
    language: str | None = None
    instructions: str | None = None
    loudness_lufs: float | None = None  # target integrated loudness; None leaves the level alone
    sentence_silence: float | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    seed: int | None = None  # the engines whose ``seed`` capability is true honour it (same seed, same audio)
    prompt: VoicePrompt | None = None  # an uploaded voice to clone (zero_shot); needs the cloning capability
    # Pronunciation dictionaries, in precedence order, applied before the text is cut (synth.lexicon).
    dictionaries: tuple[Lexicon, ...] = ()


@dataclass
class SynthesisResult:
    path: str
    format: str
    sample_rate: int
    duration_seconds: float
    bytes: int
    chunks: int
    synth_ms: int
    rtf: float
    peak_rss_mb: float
    peak_gpu_mb: float | None
    engine: str
    device: str
    voice: str
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # per sentence: the batch it ran in (batching only)
    # Served from the sentence cache (synth.cache): the characters of those sentences, and how many.
    cached_characters: int = 0
    cached_sentences: int = 0
    # Per pronunciation dictionary: id, version, name, rules_applied, replacements (synth.lexicon).
    dictionaries: list[dict[str, Any]] = field(default_factory=list)
    # {"words": [...], "sentences": [...]}: seconds and offsets into the submitted text (synth.timestamps);
    # a word's list is empty for an engine that cannot tell where its words are.
    timestamps: dict[str, Any] | None = None


@dataclass
class Plan:
    """A validated request resolved for one engine call."""

    voice: VoiceInfo  # the voice that speaks (an instruction may switch eSpeak voices)
    params: VoiceParams
    silence: float  # seconds between sentences
    applied: list[str]
    not_applied: list[str]


def _number(name: str, value: Any, lo: float, hi: float, unit: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UnsupportedControl(f"{name} must be a number")
    if not lo <= value <= hi:
        raise UnsupportedControl(f"{name} {value:g}{unit} is out of range ({lo:g}..{hi:g}{unit})")
    return float(value)


def _language_ok(language: str, voice: VoiceInfo) -> bool:
    lang = language.lower().replace("_", "-")
    if lang in [x.lower().replace("_", "-") for x in voice.capabilities.get("languages", [])]:
        return True
    if voice.capabilities.get("language_switch"):  # eSpeak: another of its voices speaks it
        return espeak_voice_for_language(lang) is not None
    return False


def _validate_numbers(request: SynthesisRequest) -> None:
    _number("speed", request.speed, *SPEED_RANGE)
    _number("pitch", request.pitch, *PITCH_RANGE, unit=" semitones")
    _number("volume", request.volume, *VOLUME_RANGE, unit=" dB")
    if request.loudness_lufs is not None:
        _number("loudness_lufs", request.loudness_lufs, *LOUDNESS_RANGE, " LUFS")
    if request.sentence_silence is not None:
        _number("sentence_silence", request.sentence_silence, *SENTENCE_SILENCE_RANGE, " s")
    for name in ("noise_scale", "noise_w"):
        value = getattr(request, name)
        if value is not None:
            _number(name, value, *NOISE_RANGE)
    if request.seed is not None:
        if isinstance(request.seed, bool) or not isinstance(request.seed, int):
            raise UnsupportedControl("seed must be an integer")
        if not SEED_RANGE[0] <= request.seed <= SEED_RANGE[1]:
            raise UnsupportedControl(
                f"seed {request.seed} is out of range ({SEED_RANGE[0]}..{SEED_RANGE[1]})"
            )


def validate_request(request: SynthesisRequest, voice: VoiceInfo) -> None:
    """Refuse what ``voice`` cannot serve, without loading any engine."""
    from synth.audio import output_rate

    if request.format not in FORMATS:
        raise UnsupportedFormat(f"unsupported format {request.format!r}; use one of {', '.join(FORMATS)}")
    output_rate(request.format, request.sample_rate, voice.sample_rate)
    if request.prompt is not None and not voice.capabilities.get("cloning"):
        raise EngineUnavailable(f"voice {voice.id} cannot clone a voice prompt", "cloning_unavailable")
    _validate_numbers(request)
    if request.language is not None:
        if not isinstance(request.language, str) or not _language_ok(request.language, voice):
            raise UnsupportedControl(f"voice {voice.id} cannot speak language {request.language!r}")
    if request.instructions is not None:
        if not isinstance(request.instructions, str):
            raise InvalidText("instructions must be a string")
        if len(request.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise InvalidText(f"instructions are limited to {MAX_INSTRUCTIONS_CHARS} characters")
    validate_text(request.text)


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _choose_voice(
    request: SynthesisRequest,
    instr: Instructions,
    voice: VoiceInfo,
    find_voice: Callable[[str], VoiceInfo | None],
    plan: Plan,
) -> None:
    """Apply a requested language: an engine with ``language_switch`` (eSpeak) switches voice,
    the others speak only their own."""
    wanted = instr.language or request.language
    if not wanted:
        return
    if not voice.capabilities.get("language_switch"):
        if instr.language:
            plan.not_applied.append(
                f"language: {instr.language} ({voice.engine} voice {voice.id} speaks only {voice.language})"
            )
        return
    if wanted.lower() in [x.lower() for x in voice.capabilities["languages"]]:
        if instr.language:
            plan.applied.append(f"language: {wanted}")
        return
    vid = espeak_voice_for_language(wanted)
    target = find_voice(vid) if vid is not None else None
    if target is None:
        plan.not_applied.append(f"language: {wanted} (no eSpeak voice for it)")
        return
    plan.voice = target
    plan.params.voice = target.id
    plan.params.language = None
    plan.applied.append(f"language: {wanted} (voice {vid})")


def _apply_noise(request: SynthesisRequest, plan: Plan) -> None:
    """Noise scales reach only voices whose controls name them (Piper's neural ones)."""
    controls = plan.voice.capabilities.get("controls") or []
    for name in ("noise_scale", "noise_w"):
        value = getattr(request, name)
        if value is None:
            continue
        if name in controls:
            setattr(plan.params, name, value)
            plan.applied.append(f"{name}: {value:g}")
        elif plan.voice.engine == "espeak":
            plan.not_applied.append(f"{name}: eSpeak is not a neural voice")
        else:
            plan.not_applied.append(f"{name}: {plan.voice.engine} takes no {name}")


# Why an engine that does not honour a seed ignores it (others: "<engine> takes no seed").
SEED_IGNORED = {
    "espeak": "eSpeak is not a neural voice",
    "piper": "onnxruntime draws its own noise (the torch runtime honours seeds)",
}


def _apply_seed(request: SynthesisRequest, plan: Plan, seeded: bool | None) -> None:
    """A seed reaches every engine; one whose ``seed`` capability is false ignores it, with a note."""
    if request.seed is None:
        return
    if seeded is None:
        seeded = bool(plan.voice.capabilities.get("seed"))
    if seeded:
        plan.applied.append(f"seed: {request.seed}")
        return
    engine = plan.voice.engine
    plan.not_applied.append(f"seed: {SEED_IGNORED.get(engine, f'{engine} takes no seed')}")


def _describe_levels(request: SynthesisRequest, instr: Instructions, plan: Plan) -> None:
    params = plan.params
    if abs(params.speed - 1.0) > 1e-9:
        plan.applied.append(f"speed: x{params.speed:.2f}")
    if params.pitch:
        plan.applied.append(f"pitch: {params.pitch:+.1f} semitones")
    if params.volume:
        plan.applied.append(f"volume: {params.volume:+.1f} dB")
    if request.sentence_silence is not None or instr.pause != 1.0:
        plan.applied.append(f"sentence silence: {plan.silence:.2f} s")
    if request.loudness_lufs is not None:
        plan.applied.append(f"loudness: {request.loudness_lufs:g} LUFS")


def plan_controls(
    request: SynthesisRequest,
    voice: VoiceInfo,
    find_voice: Callable[[str], VoiceInfo | None],
    seeded: bool | None = None,
) -> Plan:
    """Validate ``request`` for ``voice`` and merge in its instructions.

    ``find_voice`` returns a served voice by id, or None (for eSpeak language switches).
    ``seeded``: whether the engine as it runs here honours a seed (its ``seed`` capability,
    which for Piper depends on the runtime); None reads the voice's capabilities.
    """
    validate_request(request, voice)
    instr = parse_instructions(request.instructions)
    base_silence = DEFAULT_SENTENCE_SILENCE if request.sentence_silence is None else request.sentence_silence
    params = VoiceParams(
        voice=voice.id,
        speed=_clamp(request.speed * instr.speed, SPEED_RANGE),
        pitch=_clamp(request.pitch + instr.pitch, PITCH_RANGE),
        volume=_clamp(request.volume + instr.volume, VOLUME_RANGE),
        language=request.language,
        prompt=request.prompt,
        seed=request.seed,
    )
    plan = Plan(
        voice=voice,
        params=params,
        silence=min(base_silence * instr.pause, SENTENCE_SILENCE_RANGE[1]),
        applied=[],
        not_applied=[*instr.unsupported, *(f"unrecognised instruction: {c!r}" for c in instr.unrecognised)],
    )
    _choose_voice(request, instr, voice, find_voice, plan)
    _describe_levels(request, instr, plan)
    _apply_noise(request, plan)
    _apply_seed(request, plan, seeded)
    return plan


__all__ = ["Plan", "SynthesisRequest", "SynthesisResult", "plan_controls", "validate_request"]
