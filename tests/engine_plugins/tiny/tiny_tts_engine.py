"""A tiny engine: a tone per sentence, its pitch the voice's (tests only; docs/engines.md shows it).

``clone_plugin`` is the same engine with the ``cloning`` capability: it speaks a zero_shot voice
as the first half second of its prompt per sentence, so a test can tell it was given the prompt.

It implements the plugin protocol (synth.engines.base.EnginePlugin) and the engine protocol
(synth.engines.base.Engine) with nothing but numpy. ``TINY_TTS_FAIL_LOAD=1`` in the worker's
environment makes its load fail, as a model with missing weights would.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from synth.engines.base import EngineOptions, VoiceParams, check_cancel
from synth.registry import VoiceInfo

RATE = 16000
VOICES = {"beep": 440.0, "boop": 220.0}  # voice name -> tone (Hz)
CAPABILITIES: dict[str, Any] = {
    "languages": ["en", "en-us"],
    "cloning": False,
    "instructions": False,  # the service refuses instructions for its voices (400)
    "streaming": True,
    "timestamps": False,
    "devices": ["cpu"],
    "memory_mb": 1,
    "concurrent_jobs": 1,
    "controls": ["volume"],
}


class TinyEngine:
    name = "tiny"

    def __init__(self, capabilities: dict[str, Any]) -> None:
        self.device = "cpu"
        self.caps = capabilities

    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        if os.environ.get("TINY_TTS_FAIL_LOAD") == "1":
            raise RuntimeError("tiny: weights missing (TINY_TTS_FAIL_LOAD=1)")

    def voices(self) -> list[VoiceInfo]:
        return TinyPlugin(self.caps).voices(EngineOptions())

    def capabilities(self) -> dict[str, Any]:
        return dict(self.caps)

    def sample_rate(self, voice: str) -> int:
        return RATE

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        return []

    def notes(self, params: VoiceParams) -> list[str]:
        return []

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: Callable[[int, int], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray]:
        tone = VOICES[params.voice.split(":")[-1]]  # the service namespaces ids: tiny:beep
        prompt = None
        if params.prompt is not None:
            import soundfile

            prompt, _ = soundfile.read(params.prompt.audio_path, dtype="float32")
        # Lazily, one chunk per yield: the service feeds the next sentence only after taking the
        # last one's audio (synth.cache.cached_sentences), so list(chunks) would see one sentence.
        for done, chunk in enumerate(chunks, 1):
            check_cancel(should_cancel)
            if prompt is not None:
                yield prompt[: RATE // 2].astype(np.float32)
            else:
                t = np.arange(int(RATE * 0.05 * max(1, len(chunk))), dtype=np.float32) / RATE
                yield (0.3 * np.sin(2 * np.pi * tone * t)).astype(np.float32)
            if progress is not None:
                progress(done, total or done)


class TinyPlugin:
    def __init__(self, capabilities: dict[str, Any]) -> None:
        self.caps = capabilities

    def voices(self, options: EngineOptions) -> list[VoiceInfo]:
        # Bare names: the service namespaces them with the entry point's name (tiny:beep).
        return [
            VoiceInfo(name, f"Tiny {name} (test engine)", "en", "tiny", RATE, dict(self.caps))
            for name in VOICES
        ]

    def capabilities(self, options: EngineOptions) -> dict[str, Any]:
        return dict(self.caps)

    def create(self, options: EngineOptions) -> TinyEngine:
        return TinyEngine(self.caps)


plugin = TinyPlugin(CAPABILITIES)
clone_plugin = TinyPlugin({**CAPABILITIES, "cloning": True})
clone_plugin_whole = TinyPlugin({**CAPABILITIES, "cloning": True, "streaming": False})


class WeightsEngine(TinyEngine):
    def __init__(self, capabilities: dict[str, Any], model_dir: str | None) -> None:
        super().__init__(capabilities)
        self.model_dir = model_dir

    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        from synth.errors import EngineUnavailable

        if self.model_dir is None:  # the service passes it only once verified
            raise EngineUnavailable("tinyw: no model directory TTS_MODELS_DIR/tinyw/")


class WeightsPlugin(TinyPlugin):
    """Its model is a Linear(hidden, hidden) layer; ``hidden`` is in the model's config.json."""

    def expected_tensors(self, config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
        import torch

        from synth.models import meta_tensors

        with torch.device("meta"):  # shapes and dtypes only: no memory, no weights
            module = torch.nn.Linear(int(config["hidden"]), int(config["hidden"]))
        return meta_tensors(module)

    def create(self, options: EngineOptions) -> TinyEngine:
        return WeightsEngine(self.caps, options.model_dir)


weights_plugin = WeightsPlugin(CAPABILITIES)
