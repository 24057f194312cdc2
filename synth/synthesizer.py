"""The Synthesizer: request in, audio file out, chunk by chunk.

Imports no engine at module level; engines load on ``load()`` or on first use.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from synth.errors import InvalidText, SynthError, UnknownVoice, UnsupportedControl, UnsupportedFormat
from synth.instructions import parse_instructions
from synth.registry import (
    DEFAULT_VOICE,
    ENGINES,
    FORMATS,
    PITCH_RANGE,
    SPEED_RANGE,
    VOLUME_RANGE,
    VoiceInfo,
    espeak_voice_for_language,
    get_voice,
    list_voices,
)
from synth.text import detect_language, is_chinese_language, split_sentences, validate_text

DEFAULT_SENTENCE_SILENCE = 0.2  # seconds between sentence chunks
MAX_CHUNK_CHARS = 300  # bounds memory per inference step whatever the text length
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
    loudness_lufs: float | None = None
    sentence_silence: float | None = None
    noise_scale: float | None = None
    noise_w: float | None = None


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
    if voice.engine == "espeak":
        return espeak_voice_for_language(lang) is not None
    return False


def validate_request(request: SynthesisRequest, voice: VoiceInfo) -> None:
    """Refuse what ``voice`` cannot serve, without loading any engine."""
    from synth.audio import output_rate

    if request.format not in FORMATS:
        raise UnsupportedFormat(f"unsupported format {request.format!r}; use one of {', '.join(FORMATS)}")
    output_rate(request.format, request.sample_rate, voice.sample_rate)
    _number("speed", request.speed, *SPEED_RANGE)
    _number("pitch", request.pitch, *PITCH_RANGE, unit=" semitones")
    _number("volume", request.volume, *VOLUME_RANGE, unit=" dB")
    if request.loudness_lufs is not None:
        _number("loudness_lufs", request.loudness_lufs, -60.0, -5.0, " LUFS")
    if request.sentence_silence is not None:
        _number("sentence_silence", request.sentence_silence, 0.0, 10.0, " s")
    for name in ("noise_scale", "noise_w"):
        value = getattr(request, name)
        if value is not None:
            _number(name, value, 0.0, 2.0)
    if request.language is not None:
        if not isinstance(request.language, str) or not _language_ok(request.language, voice):
            raise UnsupportedControl(f"voice {voice.id} cannot speak language {request.language!r}")
    if request.instructions is not None:
        if not isinstance(request.instructions, str):
            raise InvalidText("instructions must be a string")
        if len(request.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise InvalidText(f"instructions are limited to {MAX_INSTRUCTIONS_CHARS} characters")
    validate_text(request.text)


def _make_engine(name: str, voices_dir: str | None, threads: int | None) -> Any:
    if name == "piper":
        from synth.engines.piper import PiperEngine

        return PiperEngine(voices_dir=voices_dir, threads=threads)
    if name == "espeak":
        from synth.engines.espeak import EspeakEngine

        return EspeakEngine(voices_dir=voices_dir, threads=threads)
    raise UnknownVoice(f"unknown engine {name!r}")


def _remove(path: str | None) -> None:
    if path:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


class Synthesizer:
    """Loads engines on a device and turns requests into audio files."""

    def __init__(
        self,
        device: str = "cpu",
        voices_dir: str | None = None,
        engines: list[str] | None = None,
        threads: int | None = None,
    ) -> None:
        self.device = device
        self.voices_dir = voices_dir
        self.engine_names = list(engines) if engines else list(ENGINES)
        for e in self.engine_names:
            if e not in ENGINES:
                raise ValueError(f"unknown engine {e!r}; known: {', '.join(ENGINES)}")
        self.threads = threads
        self._engines: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- engines ---------------------------------------------------------------------------
    def engine(self, name: str) -> Any:
        with self._lock:
            eng = self._engines.get(name)
            if eng is None:
                if name not in self.engine_names:
                    raise UnknownVoice(f"engine {name!r} is not served here")
                eng = _make_engine(name, self.voices_dir, self.threads)
                eng.load(self.device if name == "piper" else "cpu", [])
                self._engines[name] = eng
            return eng

    def load(self, voice_ids: list[str] | None = None) -> None:
        """Load engines (and the given voices, or every voice) up front."""
        for name in self.engine_names:
            wanted: list[str] | None = None
            if voice_ids is not None:
                wanted = [v for v in voice_ids if self._serves(v, name)]
                if not wanted:
                    continue
                for v in wanted:
                    self.voice(v)  # raises UnknownVoice
            with self._lock:
                eng = self._engines.get(name) or _make_engine(name, self.voices_dir, self.threads)
                eng.load(self.device if name == "piper" else "cpu", wanted)
                self._engines[name] = eng

    @staticmethod
    def _serves(voice_id: str, engine: str) -> bool:
        return voice_id.startswith("espeak-") == (engine == "espeak")

    def warm_up(self) -> None:
        """One short synthesis per loaded engine, so the first request is not the slow one."""
        from synth.engines.base import VoiceParams

        for name, eng in list(self._engines.items()):
            voices = eng.voices()
            if not voices:
                continue
            vid = (
                DEFAULT_VOICE
                if name == "piper" and any(v.id == DEFAULT_VOICE for v in voices)
                else voices[0].id
            )
            if name == "espeak":
                vid = "espeak-en-us" if any(v.id == "espeak-en-us" for v in voices) else vid
            for _ in eng.synthesize(["Hello."], VoiceParams(voice=vid)):
                pass

    def voices(self) -> list[VoiceInfo]:
        return list_voices(self.voices_dir, self.engine_names)

    def voice(self, voice_id: str) -> VoiceInfo:
        return get_voice(voice_id, self.voices_dir, self.engine_names)

    # -- synthesis -------------------------------------------------------------------------------
    def plan(self, request: SynthesisRequest) -> tuple[VoiceInfo, Any, list[str], list[str], float]:
        """Resolve voice and controls: ``(voice, VoiceParams, applied, not_applied, silence)``."""
        from synth.engines.base import VoiceParams

        voice = self.voice(request.voice)
        validate_request(request, voice)
        instr = parse_instructions(request.instructions)
        applied: list[str] = []
        not_applied: list[str] = list(instr.unsupported)
        not_applied.extend(f"unrecognised instruction: {c!r}" for c in instr.unrecognised)

        speed = min(max(request.speed * instr.speed, SPEED_RANGE[0]), SPEED_RANGE[1])
        pitch = min(max(request.pitch + instr.pitch, PITCH_RANGE[0]), PITCH_RANGE[1])
        volume = min(max(request.volume + instr.volume, VOLUME_RANGE[0]), VOLUME_RANGE[1])
        base_silence = (
            DEFAULT_SENTENCE_SILENCE if request.sentence_silence is None else request.sentence_silence
        )
        silence = min(base_silence * instr.pause, 10.0)
        language = request.language
        target = voice
        wanted_lang = instr.language or request.language
        if wanted_lang:
            if voice.engine == "espeak":
                langs = [x.lower() for x in voice.capabilities["languages"]]
                if wanted_lang.lower() not in langs:
                    vid = espeak_voice_for_language(wanted_lang)
                    if vid is None or vid not in {v.id for v in self.voices()}:
                        not_applied.append(f"language: {wanted_lang} (no eSpeak voice for it)")
                    else:
                        target = self.voice(vid)
                        language = None
                        applied.append(f"language: {wanted_lang} (voice {vid})")
                elif instr.language:
                    applied.append(f"language: {wanted_lang}")
            elif instr.language:
                not_applied.append(
                    f"language: {instr.language} (Piper voice {voice.id} speaks only {voice.language})"
                )
        if abs(speed - 1.0) > 1e-9:
            applied.append(f"speed: x{speed:.2f}")
        if pitch:
            applied.append(f"pitch: {pitch:+.1f} semitones")
        if volume:
            applied.append(f"volume: {volume:+.1f} dB")
        if request.sentence_silence is not None or instr.pause != 1.0:
            applied.append(f"sentence silence: {silence:.2f} s")
        if request.loudness_lufs is not None:
            applied.append(f"loudness: {request.loudness_lufs:g} LUFS")
        noise_scale, noise_w = request.noise_scale, request.noise_w
        if target.engine != "piper":
            for name in ("noise_scale", "noise_w"):
                if getattr(request, name) is not None:
                    not_applied.append(f"{name}: eSpeak is not a neural voice")
            noise_scale = noise_w = None
        else:
            if noise_scale is not None:
                applied.append(f"noise_scale: {noise_scale:g}")
            if noise_w is not None:
                applied.append(f"noise_w: {noise_w:g}")
        params = VoiceParams(
            voice=target.id,
            speed=speed,
            pitch=pitch,
            volume=volume,
            language=language,
            noise_scale=noise_scale,
            noise_w=noise_w,
        )
        return target, params, applied, not_applied, silence

    def synthesize(
        self,
        request: SynthesisRequest,
        out_path: str,
        progress: Callable[[int, int], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> SynthesisResult:
        import numpy as np

        from synth.audio import Encoder, LoudnessMeter, StreamResampler, output_rate
        from synth.engines.base import check_cancel
        from synth.telemetry import PeakMemory

        started = time.monotonic()
        voice, params, applied, not_applied, silence = self.plan(request)
        eng = self.engine(voice.engine)
        notes = getattr(eng, "notes", None)
        if notes is not None:
            not_applied.extend(notes(params))
        chinese = is_chinese_language(voice.language) or detect_language(request.text) == "zh"
        split_lang = "zh" if chinese else "en"
        total = sum(1 for _ in split_sentences(request.text, split_lang, MAX_CHUNK_CHARS))
        if total == 0:
            raise InvalidText("text has nothing speakable")
        native = int(eng.sample_rate(voice.id))
        out_rate = output_rate(request.format, request.sample_rate, native)

        out_path = os.path.abspath(out_path)
        directory, base = os.path.split(out_path)
        tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.part")
        raw_tmp: str | None = None
        encoder: Encoder | None = None
        gap = np.zeros(int(round(silence * native)), dtype=np.float32)
        with PeakMemory(eng.device) as mem:
            try:
                chunks = split_sentences(request.text, split_lang, MAX_CHUNK_CHARS)
                audio_iter = eng.synthesize(
                    chunks, params, progress=progress, should_cancel=should_cancel, total=total
                )
                resampler = StreamResampler(native, out_rate)
                encoder = Encoder(tmp, request.format, out_rate)
                if request.loudness_lufs is None:
                    for i, audio in enumerate(audio_iter):
                        if i and gap.size:
                            encoder.write(resampler.process(gap))
                        encoder.write(resampler.process(audio))
                else:
                    # Pass 1: float32 to a temp file while measuring; pass 2: gain while encoding.
                    raw_tmp = tmp + ".f32"
                    meter = LoudnessMeter(native)
                    with open(raw_tmp, "wb") as fh:
                        for i, audio in enumerate(audio_iter):
                            for piece in (gap, audio) if i and gap.size else (audio,):
                                meter.add(piece)
                                fh.write(np.asarray(piece, dtype=np.float32).tobytes())
                    measured = meter.integrated()
                    gain = (
                        1.0
                        if not math.isfinite(measured)
                        else 10 ** ((request.loudness_lufs - measured) / 20.0)
                    )
                    with open(raw_tmp, "rb") as fh:
                        while True:
                            check_cancel(should_cancel)
                            block = np.frombuffer(fh.read(native * 4 * 4), dtype=np.float32)
                            if block.size == 0:
                                break
                            encoder.write(resampler.process(block * gain))
                encoder.write(resampler.process(np.zeros(0, dtype=np.float32), last=True))
                frames = encoder.frames
                encoder.close()
                if frames == 0:
                    raise InvalidText("the text produced no audio")
                os.replace(tmp, out_path)
            except BaseException:
                if encoder is not None:
                    encoder.abort()
                _remove(tmp)
                raise
            finally:
                _remove(raw_tmp)
        elapsed = time.monotonic() - started
        duration = frames / out_rate
        return SynthesisResult(
            path=out_path,
            format=request.format,
            sample_rate=out_rate,
            duration_seconds=duration,
            bytes=os.path.getsize(out_path),
            chunks=total,
            synth_ms=int(elapsed * 1000),
            rtf=elapsed / duration if duration else 0.0,
            peak_rss_mb=round(mem.peak_rss_mb, 1),
            peak_gpu_mb=mem.peak_gpu_mb,
            engine=voice.engine,
            device=eng.device,
            voice=voice.id,
            applied=applied,
            not_applied=not_applied,
        )


_DEFAULT: Synthesizer | None = None
_DEFAULT_LOCK = threading.Lock()


def synthesize(text: str, out_path: str, **kwargs: Any) -> SynthesisResult:
    """One-call synthesis with a cached default :class:`Synthesizer` (CPU, all engines).

    ``kwargs`` are :class:`SynthesisRequest` fields, plus optional ``progress``
    and ``should_cancel`` callables.
    """
    global _DEFAULT
    progress = kwargs.pop("progress", None)
    should_cancel = kwargs.pop("should_cancel", None)
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Synthesizer()
        synth = _DEFAULT
    return synth.synthesize(SynthesisRequest(text=text, **kwargs), out_path, progress, should_cancel)


__all__ = [
    "SynthError",
    "SynthesisRequest",
    "SynthesisResult",
    "Synthesizer",
    "synthesize",
    "validate_request",
]
