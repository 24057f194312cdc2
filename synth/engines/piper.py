"""Piper: neural VITS voices on onnxruntime.

On ``cuda``/``cuda:N`` the ONNX CUDA execution provider is required; when it
is missing we raise EngineUnavailable rather than quietly running on CPU.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
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
from synth.normalize import escape_markup_mapped, is_chinese_language, normalize_mapped
from synth.registry import VoiceInfo, engine_capabilities, list_voices
from synth.text import iter_segments
from synth.timestamps import PAUSE_PHONEMES, SpokenWord, WordTiming, phoneme_words, place, scaled, words_of

if TYPE_CHECKING:
    import numpy as np

ChunkAudio = Callable[..., "np.ndarray"]  # a job's ``_chunk_audio`` (synthesize's per-job state bound)


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
    word_timings = True  # synthesize() fills ``timings`` (synth.timestamps)

    def __init__(
        self,
        voices_dir: str | None = None,
        threads: int | None = None,
        solo_threads: int | None = None,
        busy: Callable[[], bool] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        """``solo_threads``: inference threads for a sentence while ``busy()`` says no other job
        runs on the host (a second session per voice; CPU only); else ``threads``. ``cache_dir``:
        where the voices patched to expose their durations are kept (else patched in memory at
        each load)."""
        self.voices_dir = voices_dir
        self.cache_dir = cache_dir
        self._word_phonemes: dict[tuple[str, str], int] = {}
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
        model = aligned_model(model_path, self.cache_dir)
        try:
            session = onnxruntime.InferenceSession(model, opts, providers)
        except Exception:
            if not isinstance(model, str) or model == model_path:
                raise
            # A cached patched copy that does not load (damaged on disk): dropped, patched afresh.
            os.remove(model)
            session = onnxruntime.InferenceSession(aligned_model(model_path, self.cache_dir), opts, providers)
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
        return notes

    # -- text -> engine input ----------------------------------------------------------------
    def render(self, sentence: str, params: VoiceParams) -> str:
        """The string handed to Piper: escaped text plus ``[[ ipa ]]`` for annotations."""
        return self.render_words(sentence, params)[0]

    def render_words(self, sentence: str, params: VoiceParams) -> tuple[str, list[SpokenWord]]:
        """:meth:`render`, and the words it speaks with their characters in ``sentence``."""
        voice = self._voice(params.voice)
        language = params.language or self._infos[params.voice].language
        allowed = voice.config.phoneme_id_map
        parts: list[str] = []
        words: list[SpokenWord] = []
        for seg in iter_segments(sentence):
            if seg.kind == "text":
                lang = "zh" if is_chinese_language(language) else language
                mapped = escape_markup_mapped(normalize_mapped(seg.text, lang, seg.start))
                parts.append(mapped.text)
                words.extend(words_of(mapped))
                continue
            if seg.kind == "arpabet":
                ipa = arpabet_to(seg.tokens, ARPABET_IPA, "ˈ", "ˌ")
            else:
                from synth.espeak_lib import get_lib

                ipa = get_lib().text_to_phonemes(" ".join(seg.tokens), "cmn", ipa=True)
                ipa = "".join(c for c in ipa if c in allowed or c == " ").strip()
            parts.append(f"[[ {ipa} ]]" if ipa else " ")
            if ipa:  # an annotation is one word: the bracket run as typed
                count = sum(1 for c in ipa if c not in " ")
                words.append(SpokenWord(seg.text, seg.start, seg.start + len(seg.text), count))
        return "".join(parts), words

    def _counted(self, voice: Any, words: list[SpokenWord]) -> list[SpokenWord]:
        """``words`` with the phonemes each has when spoken alone (what :func:`synth.timestamps.align` matches)."""
        out = []
        for w in words:
            if w.phonemes:
                out.append(w)
                continue
            key = (voice.config.espeak_voice, w.text)
            count = self._word_phonemes.get(key)
            if count is None:
                count = sum(
                    1
                    for sentence in voice.phonemize(w.text)
                    for p in sentence
                    if p not in PAUSE_PHONEMES and p.strip()
                )
                if len(self._word_phonemes) > 50_000:  # a bound on what odd texts can make it hold
                    self._word_phonemes.clear()
                self._word_phonemes[key] = count
            out.append(SpokenWord(w.text, w.char_start, w.char_end, count))
        return out

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

    def _chunk_timed(
        self, voice: Any, chunk: str, params: VoiceParams, chunk_audio: ChunkAudio | None = None
    ) -> tuple[np.ndarray, list[WordTiming]]:
        """One chunk's audio (as :meth:`_chunk_audio`) and its words' timings from the durations."""
        import numpy as np

        text, words = self.render_words(chunk, params)
        sr = int(voice.config.sample_rate)
        pieces = self._aligned_pieces(voice, text, params, chunk_audio)
        spoken: list[list[tuple[float, float]]] = []
        offset = 0.0
        aligned = all(alignments is not None for _, alignments in pieces)  # else: durations not exposed
        for piece, alignments in pieces:
            if aligned and alignments is not None:
                total = sum(n for _, n in alignments) or 1
                stretch = len(piece) / total  # the samples the durations promise, made
                for group in phoneme_words(alignments, sr):
                    spoken.append([(offset + s * stretch, offset + e * stretch) for s, e in group])
            offset += len(piece) / sr
        audio = (
            np.concatenate([p for p, _ in pieces]).astype(np.float32) if pieces else np.zeros(0, np.float32)
        )
        timings = place(self._counted(voice, words), spoken) if aligned and spoken else []
        return audio, timings

    def _aligned_pieces(
        self, voice: Any, text: str, params: VoiceParams, chunk_audio: ChunkAudio | None
    ) -> list[tuple[np.ndarray, list[tuple[str, int]] | None]]:
        """Per Piper sentence of ``text``: its audio, and (phoneme, samples) in order (None: not known)."""
        from piper.config import SynthesisConfig

        noise_scale, length_scale, noise_w = self.scales(voice, params)
        config = SynthesisConfig(
            length_scale=length_scale, noise_scale=noise_scale, noise_w_scale=noise_w, normalize_audio=True
        )
        out: list[tuple[np.ndarray, list[tuple[str, int]] | None]] = []
        for c in voice.synthesize(text, syn_config=config, include_alignments=True):
            alignments = c.phoneme_alignments
            out.append(
                (
                    c.audio_float_array,
                    None if alignments is None else [(x.phoneme, int(x.num_samples)) for x in alignments],
                )
            )
        return out

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
        timings: list[list[WordTiming]] | None = None,
    ) -> Iterator[np.ndarray]:
        """``timings``, when given, gets each chunk's word timings (synth.timestamps) before its audio."""
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
                    if timings is None:
                        audio = chunk_audio(voice, self.render(chunk, params), params)
                    else:
                        audio, words = self._chunk_timed(voice, chunk, params, chunk_audio)
                    heap.sentence_done()
                    finished = self.finish(audio, params, sr)
                    if timings is not None:
                        timings.append(scaled(words, len(finished) / len(audio) if len(audio) else 1.0))
                    yield finished
                    done += 1
                    if progress is not None:
                        progress(done, total if total is not None else done)
        finally:
            heap.job_ended()

    @contextmanager
    def _job(self, params: VoiceParams) -> Iterator[Callable[[Any, str, VoiceParams], np.ndarray]]:
        """What one job's chunks are synthesised with (a runtime may keep per-job state)."""
        yield self._chunk_audio


def aligned_model(model_path: str, cache_dir: str | None) -> str | bytes:
    """The voice's model with its durations tensor (``w_ceil``) as a second output.

    piper's ``patch_voice_with_alignment`` marks the tensor; the patched file is kept in
    ``cache_dir`` (named by the model's path, size and mtime: a changed voice file is patched
    afresh) so a worker's later children load it as fast as the original. Without a cache dir,
    or where it cannot be written (read-only, full), the patched model is handed over in memory
    (about 0.2 s a load). A model that cannot be patched is used as it is: no timestamps.
    """
    try:
        import onnx
        from piper.patch_voice_with_alignment import add_alignment_output
    except ImportError:
        return model_path
    st = os.stat(model_path)
    voice = hashlib.sha256(os.path.abspath(model_path).encode()).hexdigest()[:16]
    version = hashlib.sha256(f"{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = os.path.join(cache_dir, "piper-aligned") if cache_dir else None
    cached = os.path.join(folder, f"{voice}-{version}.onnx") if folder else None
    if cached and os.path.exists(cached):
        return cached
    model = onnx.load(model_path)
    try:
        add_alignment_output(model)
    except ValueError:  # no single Ceil tensor, or already an output (a model patched beforehand)
        return model_path
    data: bytes = model.SerializeToString()
    if cached:
        tmp = f"{cached}.{uuid.uuid4().hex}.part"
        try:
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, cached)  # atomic: children loading at once never read half a file
            _remove_older(folder, voice, cached)
            return cached
        except OSError:
            try:
                os.remove(tmp)
            except OSError:
                pass
    return data


def _remove_older(folder: str | None, voice: str, keep: str) -> None:
    """The patched copies of an earlier version of the same voice file (nothing loads them again),
    and its half-written ones a killed child left (an hour old: no writer is still at them)."""
    if not folder:
        return
    import time

    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if not name.startswith(f"{voice}-") or path == keep:
            continue
        try:
            if name.endswith(".onnx") or (
                name.endswith(".part") and os.path.getmtime(path) < time.time() - 3600
            ):
                os.remove(path)
        except OSError:
            pass


def read_config(model_path: str) -> Any:
    """piper's PiperConfig from the ``.onnx.json`` beside a model."""
    import json

    from piper.config import PiperConfig

    with open(model_path + ".json", encoding="utf-8") as fh:
        return PiperConfig.from_dict(json.load(fh))
