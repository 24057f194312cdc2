"""Piper: neural VITS voices on onnxruntime.

On ``cuda``/``cuda:N`` the ONNX CUDA execution provider is required; when it
is missing we raise EngineUnavailable rather than quietly running on CPU.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from synth.engines.base import (
    ARPABET_IPA,
    CancelFn,
    ProgressFn,
    VoiceParams,
    apply_gain_db,
    arpabet_to,
    check_cancel,
    pitch_shift_resample,
    resolve_device,
)
from synth.errors import EngineUnavailable, UnknownVoice
from synth.registry import VoiceInfo, _capabilities, list_voices
from synth.text import escape_markup, is_chinese_language, iter_segments, normalize

if TYPE_CHECKING:
    import numpy as np


# VITS rounds every phoneme (and every pad between phonemes) up to whole frames,
# so duration is not proportional to length_scale: measured on the joe voice,
# duration ratio ~= 0.24 + 0.76 * length_scale, flattening out near 0.5.
_MIN_LENGTH_SCALE = 0.25
MAX_SPEED = 2.0


def length_scale_for(speed: float) -> float:
    """The length_scale that makes the audio about ``1/speed`` as long."""
    target = 1.0 / speed
    scale = (target - 0.24) / 0.76 if target < 1.0 else (target - 0.27) / 0.73
    return max(scale, _MIN_LENGTH_SCALE)


_LIBC: Any = None


def release_free_heap() -> None:
    """Give freed heap memory back to the OS after each sentence (glibc only).

    Every VITS inference allocates and frees ~100 MB of intermediate tensors
    (the onnxruntime arena is off). glibc keeps that freed memory fragmented
    among the small long-lived allocations made meanwhile, so peak RSS crept up
    with text length: +15% from 10 to 1000 sentences, against +3% with this
    trim (docs/performance.md).
    """
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - not glibc: no trim
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


class PiperEngine:
    name = "piper"

    def __init__(self, voices_dir: str | None = None, threads: int | None = None) -> None:
        self.voices_dir = voices_dir
        self.threads = threads
        self.device = "cpu"
        self._loaded: dict[str, Any] = {}
        self._infos: dict[str, VoiceInfo] = {}
        self._lock = threading.Lock()

    # -- loading ---------------------------------------------------------------------------
    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        self.device = resolve_device(device)
        if self.device.startswith("cuda"):
            import onnxruntime

            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                raise EngineUnavailable(
                    f"device {device!r} asked for, but onnxruntime has no CUDAExecutionProvider "
                    f"(available: {', '.join(onnxruntime.get_available_providers())}); "
                    "install onnxruntime-gpu or use device='cpu'"
                )
        self._infos = {v.id: v for v in list_voices(self.voices_dir, ["piper"])}
        for vid in voice_ids if voice_ids is not None else list(self._infos):
            if vid in self._infos:
                self._voice(vid)

    def voices(self) -> list[VoiceInfo]:
        if not self._infos:
            self._infos = {v.id: v for v in list_voices(self.voices_dir, ["piper"])}
        return list(self._infos.values())

    def capabilities(self) -> dict[str, Any]:
        langs = sorted({lang for v in self.voices() for lang in v.capabilities["languages"]})
        return _capabilities("piper", langs)

    def sample_rate(self, voice: str) -> int:
        return int(self._voice(voice).config.sample_rate)

    def _voice(self, vid: str) -> Any:
        with self._lock:
            if vid in self._loaded:
                return self._loaded[vid]
            info = {v.id: v for v in self.voices()}.get(vid)
            if info is None or info.model_path is None:
                raise UnknownVoice(f"unknown Piper voice {vid!r}")
            try:
                import json

                import onnxruntime
                from piper import PiperVoice
                from piper.config import PiperConfig

                opts = onnxruntime.SessionOptions()
                # Sentence lengths vary; an arena sized by the largest one is kept for the life
                # of the worker, so RSS would creep with text length. Plain allocations stay flat.
                opts.enable_cpu_mem_arena = False
                opts.enable_mem_pattern = False
                if self.threads:
                    opts.intra_op_num_threads = self.threads
                    opts.inter_op_num_threads = 1
                providers: list[Any]
                if self.device.startswith("cuda"):
                    providers = [
                        (
                            "CUDAExecutionProvider",
                            {
                                "device_id": int(self.device.split(":")[1]),
                                "cudnn_conv_algo_search": "HEURISTIC",
                            },
                        )
                    ]
                else:
                    providers = ["CPUExecutionProvider"]
                session = onnxruntime.InferenceSession(
                    info.model_path, sess_options=opts, providers=providers
                )
                if self.device.startswith("cuda") and "CUDAExecutionProvider" not in session.get_providers():
                    raise EngineUnavailable(f"onnxruntime could not start the CUDA provider on {self.device}")
                with open(info.model_path + ".json", encoding="utf-8") as fh:
                    config = PiperConfig.from_dict(json.load(fh))
                voice = PiperVoice(session=session, config=config)
            except EngineUnavailable:
                raise
            except Exception as exc:  # a broken model file must not look like a bad request
                raise EngineUnavailable(f"Piper voice {vid!r} failed to load: {exc}") from exc
            self._loaded[vid] = voice
            return voice

    def notes(self, params: VoiceParams) -> list[str]:
        """Controls Piper can only approximate for these parameters."""
        if params.speed > MAX_SPEED:
            return [
                f"speed {params.speed:g}: Piper voices reach about x{MAX_SPEED:g}; the audio is slower than asked"
            ]
        return []

    # -- text -> engine input ----------------------------------------------------------------
    def render(self, sentence: str, params: VoiceParams) -> str:
        """The string handed to Piper: escaped text plus ``[[ ipa ]]`` for annotations."""
        voice = self._voice(params.voice)
        language = params.language or self._infos[params.voice].language
        allowed = voice.config.phoneme_id_map
        parts: list[str] = []
        for seg in iter_segments(sentence):
            if seg.kind == "text":
                parts.append(
                    escape_markup(normalize(seg.text, "zh" if is_chinese_language(language) else language))
                )
            elif seg.kind == "arpabet":
                ipa = arpabet_to(seg.tokens, ARPABET_IPA, "ˈ", "ˌ")
                parts.append(f"[[ {ipa} ]]")
            else:
                from synth.engines._espeak_lib import get_lib

                ipa = get_lib().text_to_phonemes(" ".join(seg.tokens), "cmn", ipa=True)
                ipa = "".join(c for c in ipa if c in allowed or c == " ").strip()
                parts.append(f"[[ {ipa} ]]" if ipa else " ")
        return "".join(parts)

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        voice = self._voice(params.voice)
        return [p for sentence in voice.phonemize(self.render(text, params)) for p in sentence]

    # -- synthesis -----------------------------------------------------------------------------
    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray]:
        import numpy as np
        from piper.config import SynthesisConfig

        voice = self._voice(params.voice)
        sr = int(voice.config.sample_rate)
        factor = 2 ** (params.pitch / 12.0)
        config = SynthesisConfig(
            length_scale=float(voice.config.length_scale) * length_scale_for(params.speed) * factor,
            noise_scale=params.noise_scale,
            noise_w_scale=params.noise_w,
            normalize_audio=True,
        )
        done = 0
        for chunk in chunks:
            check_cancel(should_cancel)
            text = self.render(chunk, params)
            pieces = [c.audio_float_array for c in voice.synthesize(text, syn_config=config)]
            audio = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
            release_free_heap()
            audio = pitch_shift_resample(audio, params.pitch, sr)
            yield apply_gain_db(audio, params.volume)
            done += 1
            if progress is not None:
                progress(done, total if total is not None else done)
