"""The plugins of the engines this project ships, as its entry points name them.

pyproject.toml registers them in the group ``tts_service.engines`` exactly as a
third-party package registers its own (docs/engines.md): ``piper`` and
``espeak``. Listing voices loads no model; ``create`` imports the runtime only
then (onnxruntime or torch for Piper: a runtime option of one engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synth.engines.base import Engine
from synth.registry import EngineOptions

if TYPE_CHECKING:
    from synth.registry import VoiceInfo

PIPER_RUNTIMES = ("onnxruntime", "torch")


class PiperPlugin:
    """Piper (VITS) voices on onnxruntime, or on torch (fp16 and batching on CUDA)."""

    warm_up_voice = "en_US-joe-medium"

    def voices(self, options: EngineOptions) -> list[VoiceInfo]:
        from synth.registry import _piper_voices

        return _piper_voices(options.voices_dir)

    def capabilities(self, options: EngineOptions) -> dict[str, Any]:
        from synth.registry import engine_capabilities

        langs = sorted({lang for v in self.voices(options) for lang in v.capabilities["languages"]})
        caps = engine_capabilities("piper", langs)
        if options.piper_runtime == "torch":
            caps["concurrent_jobs"] = max(1, options.batch_jobs)  # the batcher's shared passes
            caps["seed"] = True  # the torch runtime draws its noise from the job's seed
        return caps

    def create(self, options: EngineOptions) -> Engine:
        if options.piper_runtime not in PIPER_RUNTIMES:
            raise ValueError(
                f"unknown Piper runtime {options.piper_runtime!r}; known: {', '.join(PIPER_RUNTIMES)}"
            )
        if options.piper_runtime == "torch":
            from synth.engines.piper_torch import PiperTorchEngine

            return PiperTorchEngine(
                voices_dir=options.voices_dir,
                threads=options.threads,
                batch_jobs=options.batch_jobs,
                batch_wait_ms=options.batch_wait_ms,
            )
        from synth.engines.piper import PiperEngine

        return PiperEngine(
            voices_dir=options.voices_dir,
            threads=options.threads,
            solo_threads=options.solo_threads,
            busy=options.busy,
            cache_dir=options.model_cache_dir,
        )


class EspeakPlugin:
    """eSpeak NG 1.52 through ctypes: 100+ languages, the CPU only."""

    warm_up_voice = "espeak-en-us"

    def voices(self, options: EngineOptions) -> list[VoiceInfo]:
        from synth.registry import _espeak_voices

        return _espeak_voices()

    def capabilities(self, options: EngineOptions) -> dict[str, Any]:
        from synth.registry import engine_capabilities

        langs = sorted({lang for v in self.voices(options) for lang in v.capabilities["languages"]})
        return engine_capabilities("espeak", langs)

    def create(self, options: EngineOptions) -> Engine:
        from synth.engines.espeak import EspeakEngine

        return EspeakEngine(voices_dir=options.voices_dir, threads=options.threads)


piper = PiperPlugin()
espeak = EspeakPlugin()
