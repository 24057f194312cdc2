"""VoxCPM (1.5 and 2) from a model directory, built from the ``voxcpm`` package's classes.

The model directory is ``TTS_MODELS_DIR/voxcpm/`` in the authors' published snapshot layout
(docs/engines.md): ``config.json`` (``architecture``: ``voxcpm2`` or ``voxcpm`` for 1.5),
``model.safetensors`` (the LMs, encoder, DiT, projections), ``audiovae.safetensors`` (the
audio VAE, its names without the ``audio_vae.`` prefix) and the tokenizer files.

The engine builds the model itself, as the package's ``from_local`` does, but:

- dtype: float32 on the CPU; on CUDA bfloat16 where the device supports it, else float16
  (the VAE stays float32, as the package keeps it);
- strict loading: a tensor the model has and the files lack, or one the files have and the
  model does not, is an error (``from_local`` loads with ``strict=False``, so a checkpoint with
  layers removed loads with random layers);
- no hub access (the tokenizer is read with ``local_files_only``), no torch.compile, no
  denoiser, no retry of "bad cases", no prints or progress bars in the worker's log
  (the package's prints go to a captured stream, logged at DEBUG; the bar is off: see
  :mod:`synth.engines.voxcpm_package`);
- the number of patches a sentence may generate is derived from its text (the package's own
  rule, tokens x 6 + 10) and capped by what is left of the model's context (``max_length``
  positions, its KV cache) after the prompt; a sentence whose text alone does not leave room
  is split on words.

Audio comes sentence by sentence from the package's streaming generator
(``generate_streaming``): a cancel is seen between two generated patches. One job runs on a
loaded model at a time (``concurrent_jobs`` 1: its KV caches are static, batch 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import threading
import time
import types
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synth.engines.base import (
    CancelFn,
    Engine,
    ProgressFn,
    VoiceParams,
    apply_gain_db,
    check_cancel,
    resolve_device,
)
from synth.errors import EngineUnavailable, SynthError, UnknownVoice
from synth.registry import EngineOptions, VoiceInfo

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

NAME = "voxcpm"
VOICE = "default"  # the model's own voice (no prompt); an uploaded zero_shot voice clones
ARCHITECTURES = ("voxcpm2", "voxcpm")
# Output rates when the config does not say (VoxCPM2's VAE decodes to 48 kHz, VoxCPM 1.5's 44.1 kHz).
DEFAULT_RATES = {"voxcpm2": 48000, "voxcpm": 44100}
LANGUAGES = ["en", "zh"]
TEXT_RATIO = 6  # patches per text token at most, plus TEXT_EXTRA: the package's bad-case bound
TEXT_EXTRA = 10
MIN_PATCHES = 2  # the package's min_len
INFERENCE_TIMESTEPS = 10
CFG_VALUE = 2.0
RUNTIME_MB = 300  # torch, the tokenizer and activations beside the weights (CPU figure, rounded up)


def model_dir_for(options: EngineOptions) -> Path | None:
    """The model directory: the verified one the worker passes, else ``<models dir>/voxcpm``."""
    if options.model_dir:
        return Path(options.model_dir)
    root = options.models_dir or os.environ.get("TTS_MODELS_DIR")
    if root and (Path(root) / NAME / "config.json").is_file():
        return Path(root) / NAME
    return None


def read_config(directory: Path) -> dict[str, Any]:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineUnavailable(f"voxcpm: {directory}/config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise EngineUnavailable(f"voxcpm: {directory}/config.json is not a JSON object")
    return config


def architecture_of(config: dict[str, Any]) -> str:
    arch = str(config.get("architecture") or "voxcpm").lower()
    if arch not in ARCHITECTURES:
        raise EngineUnavailable(f"voxcpm: unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    return arch


def output_rate_of(config: dict[str, Any]) -> int:
    vae = config.get("audio_vae_config") or {}
    arch = str(config.get("architecture") or "voxcpm").lower()
    rate = (
        vae.get("out_sample_rate") or vae.get("sample_rate") if arch == "voxcpm2" else vae.get("sample_rate")
    )
    return int(rate or DEFAULT_RATES.get(arch, 48000))


def _modules(arch: str) -> Any:
    from synth.engines.voxcpm_package import PackageMissing, model_module

    try:
        return model_module(arch)
    except PackageMissing as exc:
        hint = " (VoxCPM 1.5's model imports torchaudio)" if arch == "voxcpm" else ""
        raise EngineUnavailable(f"voxcpm: {exc}{hint}") from exc


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The package's prints and warnings, kept out of the worker's log (DEBUG instead)."""
    captured = io.StringIO()
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(captured),
        contextlib.redirect_stderr(captured),
    ):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            text = captured.getvalue().strip()
            if text:
                log.debug("voxcpm said: %s", text)


def read_tokenizer(directory: Path) -> Any:
    from transformers import LlamaTokenizerFast

    return LlamaTokenizerFast.from_pretrained(str(directory), local_files_only=True)


def build_model(
    module: Any,
    arch: str,
    tokenizer: Any,
    config: dict[str, Any],
    device: str,
    dtype: str,
    max_length: int | None = None,
) -> Any:
    """The model from the package's classes, on ``device`` in ``dtype``, its weights not loaded.

    ``max_length``: the KV caches' positions, when not the config's (verify builds with 1).
    """
    import torch

    parsed = module.VoxCPMConfig.model_validate(config)
    parsed.dtype = dtype
    parsed.device = "cuda" if device.startswith("cuda") else device
    if max_length is not None:
        parsed.max_length = max_length
    vae_config = getattr(parsed, "audio_vae_config", None)
    if arch == "voxcpm2":
        vae_cls, vae_config_cls = module.AudioVAEV2, module.AudioVAEConfigV2
    else:
        vae_cls, vae_config_cls = module.AudioVAE, module.AudioVAEConfig
    if vae_config is not None and not isinstance(vae_config, vae_config_cls):
        vae_config = vae_config_cls.model_validate(vae_config.model_dump())
    model_cls = module.VoxCPM2Model if arch == "voxcpm2" else module.VoxCPMModel
    with _quiet():  # "Running on device ...", weight_norm's deprecation warning
        audio_vae = vae_cls(config=vae_config) if vae_config is not None else vae_cls()
        model = model_cls(parsed, tokenizer, audio_vae, None, device=device)
    model = model.to(getattr(torch, dtype))
    model.audio_vae = model.audio_vae.to(torch.float32)
    return model


def strict_load(model: Any, directory: Path) -> None:
    """The files' tensors into ``model``; any tensor missing or unexpected is an EngineUnavailable."""
    from safetensors.torch import load_file

    main, vae = directory / "model.safetensors", directory / "audiovae.safetensors"
    for path in (main, vae):
        if not path.is_file():
            raise EngineUnavailable(f"voxcpm: {directory}: no {path.name}")
    try:
        state = load_file(str(main), device="cpu")
        state.update({f"audio_vae.{k}": v for k, v in load_file(str(vae), device="cpu").items()})
    except Exception as exc:  # safetensors raises its own error for a truncated or corrupt file
        raise EngineUnavailable(f"voxcpm: {directory}: unreadable weights: {exc}") from exc
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise EngineUnavailable(
            f"voxcpm: {directory}: the checkpoint does not match the model: " + "; ".join(parts)
        )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # a shape that differs
        raise EngineUnavailable(f"voxcpm: {directory}: {str(exc).splitlines()[0]} {exc}"[:800]) from exc


def pick_dtype(device: str) -> str:
    import torch

    if not device.startswith("cuda"):
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


class VoxCPMEngine:
    """One VoxCPM model, loaded on one device; one job at a time."""

    name = NAME
    word_timings = False

    def __init__(self, model_dir: str | None = None, threads: int | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir else None
        self.threads = threads
        self.device = "cpu"
        self.dtype = "float32"
        self.model: Any = None
        self.config: dict[str, Any] = {}
        self.arch = "voxcpm2"
        self.rate = DEFAULT_RATES["voxcpm2"]
        self.load_s = 0.0
        self._job_lock = threading.Lock()

    # -- loading -------------------------------------------------------------------------------
    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        if self.model is not None:
            return
        if self.model_dir is None or not self.model_dir.is_dir():
            raise EngineUnavailable(f"voxcpm: no model directory (TTS_MODELS_DIR/{NAME}/; docs/engines.md)")
        started = time.monotonic()
        self.config = read_config(self.model_dir)
        self.arch = architecture_of(self.config)
        module = _modules(self.arch)
        import torch

        self.device = resolve_device(device, has_cuda=torch.cuda.is_available)
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineUnavailable(f"voxcpm: device {self.device} but CUDA is not available")
        if self.threads and not self.device.startswith("cuda"):
            torch.set_num_threads(max(1, int(self.threads)))
        self.dtype = pick_dtype(self.device)
        try:
            tokenizer = read_tokenizer(self.model_dir)
            model = build_model(module, self.arch, tokenizer, self.config, self.device, self.dtype)
        except SynthError:
            raise
        except Exception as exc:  # a config the package refuses, an unreadable tokenizer
            raise EngineUnavailable(f"voxcpm: {self.model_dir}: {type(exc).__name__}: {exc}"[:800]) from exc
        strict_load(model, self.model_dir)
        self.model = model.to(self.device).eval()
        self.rate = int(self.model.sample_rate)
        self.load_s = time.monotonic() - started
        log.info(
            "voxcpm %s loaded from %s on %s (%s) in %.1f s",
            self.arch,
            self.model_dir,
            self.device,
            self.dtype,
            self.load_s,
        )

    def unload(self) -> None:
        """Drop the model (a recycle does it by ending the process; tests and the device check call this)."""
        self.model = None

    # -- what it is ----------------------------------------------------------------------------
    def voices(self) -> list[VoiceInfo]:
        return [_voice_info(self.rate)]

    def capabilities(self) -> dict[str, Any]:
        return plugin.capabilities(EngineOptions(model_dir=str(self.model_dir) if self.model_dir else None))

    def sample_rate(self, voice: str) -> int:
        self._check_voice(voice)
        return self.rate

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        return []

    def notes(self, params: VoiceParams) -> list[str]:
        out = []
        if abs(params.speed - 1.0) > 1e-9:
            out.append("speed: VoxCPM speaks at its own rate")
        if params.pitch:
            out.append("pitch: VoxCPM speaks at its own pitch")
        return out

    def _check_voice(self, voice: str) -> None:
        local = voice.removeprefix(NAME + ":")
        if local != VOICE:
            raise UnknownVoice(f"unknown voice {voice!r} for voxcpm")

    # -- synthesis -----------------------------------------------------------------------------
    def text_tokens(self, text: str) -> int:
        return len(self.model.text_tokenizer(text))

    def prompt_patches(self, params: VoiceParams) -> int:
        """Context positions the prompt takes (its transcript's tokens, its audio's patches, markers)."""
        prompt = params.prompt
        if prompt is None:
            return 0
        import soundfile

        seconds = float(soundfile.info(prompt.audio_path).duration)
        vae = self.model.audio_vae
        per_patch = self.model.patch_size * vae.chunk_size / float(vae.sample_rate)
        patches = int(math.ceil(seconds / per_patch)) + 2
        return patches + (self.text_tokens(prompt.transcript) if prompt.transcript else 0)

    def max_patches(self, text: str, prefix: int) -> int:
        """What one sentence may generate: its text's bound, within the context left after the prompt."""
        tokens = self.text_tokens(text)
        room = int(self.model.config.max_length) - prefix - tokens - 2
        return min(tokens * TEXT_RATIO + TEXT_EXTRA, room)

    def pieces(self, text: str, prefix: int) -> list[str]:
        """``text``, split on words where one sentence would not fit the context with its audio."""
        if self.max_patches(text, prefix) >= tokens_needed(self.text_tokens(text)):
            return [text]
        words, out, current = text.split(), [], ""
        for word in words:
            candidate = f"{current} {word}".strip()
            if current and self.max_patches(candidate, prefix) < tokens_needed(self.text_tokens(candidate)):
                out.append(current)
                current = word
            else:
                current = candidate
        if current:
            out.append(current)
        for piece in out:
            if self.max_patches(piece, prefix) < MIN_PATCHES + 2:
                raise SynthError(
                    f"voxcpm: a word of {len(piece)} characters does not fit the model's context "
                    f"({self.model.config.max_length} positions)",
                    code="invalid_text",
                )
        return out

    def _generate(
        self, text: str, params: VoiceParams, prefix: int, should_cancel: CancelFn | None
    ) -> Iterator[Any]:
        """The package's streaming generator for one piece of text; a cancel seen between patches."""
        import torch

        kwargs: dict[str, Any] = {
            "target_text": text,
            "min_len": MIN_PATCHES,
            "max_len": self.max_patches(text, prefix),
            "inference_timesteps": INFERENCE_TIMESTEPS,
            "cfg_value": CFG_VALUE,
            "retry_badcase": False,
        }
        prompt = params.prompt
        if prompt is not None:
            if prompt.transcript and self.arch == "voxcpm2":
                kwargs.update(prompt_wav_path=prompt.audio_path, prompt_text=prompt.transcript)
            elif self.arch == "voxcpm2":
                kwargs["reference_wav_path"] = prompt.audio_path
            else:
                kwargs.update(prompt_wav_path=prompt.audio_path, prompt_text=prompt.transcript)
        generator = self.model.generate_streaming(**kwargs)
        try:
            with _quiet():
                for piece in generator:
                    yield piece.to(torch.float32).reshape(-1).numpy()
                    check_cancel(should_cancel)
        finally:
            generator.close()

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray]:
        import numpy as np
        import torch

        if self.model is None:
            raise EngineUnavailable("voxcpm: the model is not loaded")
        self._check_voice(params.voice)
        with self._job_lock:  # one job per loaded model: its KV caches are shared state
            seeds = torch.Generator().manual_seed(int(params.seed)) if params.seed is not None else None
            prefix = self.prompt_patches(params)
            done = 0
            for chunk in chunks:
                check_cancel(should_cancel)
                parts: list[np.ndarray] = []
                for piece in self.pieces(chunk, prefix):
                    if seeds is not None:  # each sentence its own draw from the job's seed
                        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=seeds)))
                    parts.extend(self._generate(piece, params, prefix, should_cancel))
                audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
                audio = np.clip(np.nan_to_num(audio), -1.0, 1.0).astype(np.float32)
                done += 1
                if progress is not None:
                    progress(done, total or done)
                yield apply_gain_db(audio, params.volume)


def tokens_needed(tokens: int) -> int:
    """The patches a sentence of ``tokens`` text tokens may need (the package's bound)."""
    return min(tokens * TEXT_RATIO + TEXT_EXTRA, MIN_PATCHES + 2 + tokens * 2)


def _voice_info(rate: int) -> VoiceInfo:
    return VoiceInfo(
        VOICE, "VoxCPM (the model's own voice; uploaded voices clone)", "en", NAME, rate, _caps()
    )


def _caps(memory_mb: int = 0) -> dict[str, Any]:
    from synth.registry import FORMATS, RATES_BY_FORMAT, STANDARD_RATES, VOLUME_RANGE

    return {
        "languages": list(LANGUAGES),
        "formats": list(FORMATS),
        "sample_rates": list(STANDARD_RATES),
        "sample_rates_by_format": {k: list(v) for k, v in RATES_BY_FORMAT.items()},
        "controls": ["volume", "sentence_silence", "loudness"],
        "volume_range": list(VOLUME_RANGE),
        "streaming": True,
        "cloning": True,
        "instructions": False,
        "timestamps": False,
        "devices": ["cpu", "cuda"],
        "memory_mb": memory_mb,
        "concurrent_jobs": 1,
        "language_switch": False,
        "seed": True,  # the flow-matching noise is drawn from the job's seed, sentence by sentence
    }


class VoxCPMPlugin:
    """The ``voxcpm`` entry point: VoxCPM2 (and 1.5 where torchaudio imports) from TTS_MODELS_DIR/voxcpm/."""

    warm_up_voice = VOICE

    def voices(self, options: EngineOptions) -> list[VoiceInfo]:
        directory = model_dir_for(options)
        rate = DEFAULT_RATES["voxcpm2"]
        if directory is not None:
            try:
                rate = output_rate_of(read_config(directory))
            except EngineUnavailable:
                pass
        return [_voice_info(rate)]

    def capabilities(self, options: EngineOptions) -> dict[str, Any]:
        directory = model_dir_for(options)
        memory = 0
        if directory is not None:
            weights = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
            memory = RUNTIME_MB + math.ceil(2 * weights / 2**20)  # bf16 files become float32 on the CPU
        return _caps(memory)

    def create(self, options: EngineOptions) -> Engine:
        return VoxCPMEngine(model_dir=options.model_dir, threads=options.threads)

    def expected_tensors(self, config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
        """The tensors a model directory must hold (``manage.py models verify voxcpm``).

        The model built from ``config`` on torch's meta device: ``model.safetensors``'s names in
        the config's ``dtype``, ``audiovae.safetensors``'s without their ``audio_vae.`` prefix in
        float32 (as the package keeps the VAE), read together (the two files' names do not overlap).
        """
        import torch

        from synth.models import meta_tensors

        arch = architecture_of(config)
        module = _modules(arch)
        dtype = str(module.VoxCPMConfig.model_validate(config).dtype)
        dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(dtype, dtype)
        # The tokenizer only masks multi-character Chinese tokens: an empty vocabulary builds it.
        tokenizer = types.SimpleNamespace(vocab={})
        with torch.device("meta"):
            model = build_model(module, arch, tokenizer, config, "cpu", dtype, max_length=1)
        return {key.removeprefix("audio_vae."): spec for key, spec in meta_tensors(model).items()}


plugin = VoxCPMPlugin()
