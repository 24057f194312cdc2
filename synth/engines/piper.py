"""Piper: neural VITS voices on onnxruntime.

On ``cuda``/``cuda:N`` the ONNX CUDA execution provider is required; when it
is missing we raise EngineUnavailable rather than quietly running on CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from synth import heap
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
from synth.normalize import escape_markup, is_chinese_language, normalize
from synth.registry import VoiceInfo, engine_capabilities, list_voices
from synth.text import iter_segments

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


class PiperEngine:
    name = "piper"
    seeded = False  # whether VoiceParams.seed decides the noise

    def __init__(
        self,
        voices_dir: str | None = None,
        threads: int | None = None,
        solo_threads: int | None = None,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        """``solo_threads``: inference threads for a sentence while ``busy()`` says no other job
        runs on the host (a second session per voice; CPU only); else ``threads``."""
        self.voices_dir = voices_dir
        self.threads = threads
        self.solo_threads = (
            solo_threads if solo_threads and busy is not None and solo_threads != threads else None
        )
        self.busy = busy
        self.device = "cpu"
        self._loaded: dict[tuple[str, int | None], Any] = {}
        self._infos: dict[str, VoiceInfo] = {}
        self._lock = threading.Lock()

    # -- loading ---------------------------------------------------------------------------
    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        self.device = self._device_for(device)
        self._infos = {v.id: v for v in list_voices(self.voices_dir, ["piper"])}
        if self.device != "cpu":
            self.solo_threads = None  # threads are the CPU's matter
        else:
            heap.keep_freed_memory()  # a sentence reuses the last one's pages (synth.heap)
        for vid in voice_ids if voice_ids is not None else list(self._infos):
            if vid in self._infos:
                self._voice(vid)
                if self.solo_threads:
                    # Both sessions loaded and run once now: part of the child's baseline,
                    # and neither a lone job's first sentence nor a busy one's is the slow one.
                    params = VoiceParams(voice=vid)
                    for threads in (self.threads, self.solo_threads):
                        session = self._voice(vid, threads)
                        self._chunk_audio(session, self.render("Hello.", params), params)

    def _device_for(self, device: str) -> str:
        """The device this runtime will use for ``device`` (raises EngineUnavailable)."""
        resolved = resolve_device(device)
        if resolved.startswith("cuda"):
            import onnxruntime

            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                raise EngineUnavailable(
                    f"device {device!r} asked for, but onnxruntime has no CUDAExecutionProvider "
                    f"(available: {', '.join(onnxruntime.get_available_providers())}); "
                    "install onnxruntime-gpu or use device='cpu'"
                )
        return resolved

    def voices(self) -> list[VoiceInfo]:
        if not self._infos:
            self._infos = {v.id: v for v in list_voices(self.voices_dir, ["piper"])}
        return list(self._infos.values())

    def capabilities(self) -> dict[str, Any]:
        langs = sorted({lang for v in self.voices() for lang in v.capabilities["languages"]})
        return engine_capabilities("piper", langs)

    def sample_rate(self, voice: str) -> int:
        return int(self._voice(voice).config.sample_rate)

    def _threads_now(self) -> int | None:
        """The session for the next sentence: every core while no other job runs on the host."""
        if self.solo_threads and self.busy is not None and not self.busy():
            return self.solo_threads
        return self.threads

    def _voice(self, vid: str, threads: int | None = None) -> Any:
        key = (vid, threads or self.threads)
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
            info = {v.id: v for v in self.voices()}.get(vid)
            if info is None or info.model_path is None:
                raise UnknownVoice(f"unknown Piper voice {vid!r}")
            try:
                voice = self._open(info.model_path, key[1])
            except EngineUnavailable:
                raise
            except Exception as exc:  # a broken model file must not look like a bad request
                raise EngineUnavailable(f"Piper voice {vid!r} failed to load: {exc}") from exc
            self._loaded[key] = voice
            return voice

    def _session(self, model_path: str, threads: int | None = None) -> Any:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        # Sentence lengths vary; an arena sized by the largest one is kept for the life
        # of the worker, so RSS would creep with text length. Plain allocations stay flat.
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        providers: list[Any] = ["CPUExecutionProvider"]
        if self.device.startswith("cuda"):
            cuda = {"device_id": int(self.device.split(":")[1]), "cudnn_conv_algo_search": "HEURISTIC"}
            providers = [("CUDAExecutionProvider", cuda)]
        session = onnxruntime.InferenceSession(model_path, sess_options=opts, providers=providers)
        if self.device.startswith("cuda") and "CUDAExecutionProvider" not in session.get_providers():
            raise EngineUnavailable(f"onnxruntime could not start the CUDA provider on {self.device}")
        return session

    def _open(self, model_path: str, threads: int | None = None) -> Any:
        """The loaded voice: piper's PiperVoice (phonemizer, config and its onnxruntime session)."""
        from piper import PiperVoice

        return PiperVoice(session=self._session(model_path, threads), config=read_config(model_path))

    def notes(self, params: VoiceParams) -> list[str]:
        """Controls Piper can only approximate (or this runtime ignores) for these parameters."""
        notes = []
        if params.speed > MAX_SPEED:
            notes.append(
                f"speed {params.speed:g}: Piper voices reach about x{MAX_SPEED:g}; the audio is slower than asked"
            )
        if params.seed is not None and not self.seeded:
            notes.append("seed: onnxruntime draws its own noise (the torch runtime honours seeds)")
        return notes

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
                from synth.espeak_lib import get_lib

                ipa = get_lib().text_to_phonemes(" ".join(seg.tokens), "cmn", ipa=True)
                ipa = "".join(c for c in ipa if c in allowed or c == " ").strip()
                parts.append(f"[[ {ipa} ]]" if ipa else " ")
        return "".join(parts)

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        voice = self._voice(params.voice)
        return [p for sentence in voice.phonemize(self.render(text, params)) for p in sentence]

    # -- synthesis -----------------------------------------------------------------------------
    def scales(self, voice: Any, params: VoiceParams) -> tuple[float, float, float]:
        """``(noise_scale, length_scale, noise_w)`` for these controls (pitch also stretches time)."""
        factor = 2 ** (params.pitch / 12.0)
        config = voice.config
        return (
            config.noise_scale if params.noise_scale is None else params.noise_scale,
            float(config.length_scale) * length_scale_for(params.speed) * factor,
            config.noise_w_scale if params.noise_w is None else params.noise_w,
        )

    def _chunk_audio(self, voice: Any, text: str, params: VoiceParams) -> np.ndarray:
        """One chunk's audio at the voice's rate, each Piper sentence peak-normalised."""
        import numpy as np
        from piper.config import SynthesisConfig

        noise_scale, length_scale, noise_w = self.scales(voice, params)
        config = SynthesisConfig(
            length_scale=length_scale, noise_scale=noise_scale, noise_w_scale=noise_w, normalize_audio=True
        )
        pieces = [c.audio_float_array for c in voice.synthesize(text, syn_config=config)]
        return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)

    def finish(self, audio: np.ndarray, params: VoiceParams, sample_rate: int) -> np.ndarray:
        """Pitch and volume, applied after synthesis."""
        return apply_gain_db(pitch_shift_resample(audio, params.pitch, sample_rate), params.volume)

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
    ) -> Iterator[np.ndarray]:
        voice = self._voice(params.voice)
        sr = int(voice.config.sample_rate)
        done = 0
        heap.job_started()
        try:
            with self._job(params) as chunk_audio:
                for chunk in chunks:
                    check_cancel(should_cancel)
                    if self.solo_threads:
                        voice = self._voice(params.voice, self._threads_now())
                    audio = chunk_audio(voice, self.render(chunk, params), params)
                    heap.sentence_done()
                    yield self.finish(audio, params, sr)
                    done += 1
                    if progress is not None:
                        progress(done, total if total is not None else done)
        finally:
            heap.job_ended()

    @contextmanager
    def _job(self, params: VoiceParams) -> Iterator[Callable[[Any, str, VoiceParams], np.ndarray]]:
        """What one job's chunks are synthesised with (a runtime may keep per-job state)."""
        yield self._chunk_audio


def read_config(model_path: str) -> Any:
    """piper's PiperConfig from the ``.onnx.json`` beside a model."""
    import json

    from piper.config import PiperConfig

    with open(model_path + ".json", encoding="utf-8") as fh:
        return PiperConfig.from_dict(json.load(fh))
