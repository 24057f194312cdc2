"""The Synthesizer: request in, audio file out, chunk by chunk.

Imports no engine at module level; engines load on ``load()`` or on first use.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synth import registry
from synth.cache import CacheStats, SentenceStore, cached_sentences, key_basis, sentence_key
from synth.engines.base import CancelFn, Engine, Pieces, ProgressFn
from synth.errors import EngineUnavailable, InvalidText, SynthError, UnknownVoice
from synth.lexicon import Rewrite, apply_lexicons
from synth.normalize import detect_language, is_chinese_language, split_sentences
from synth.registry import EngineOptions, VoiceInfo, get_voice, list_voices
from synth.request import Plan, SynthesisRequest, SynthesisResult, plan_controls, validate_request
from synth.stream import StreamWriter
from synth.timestamps import Timeline

if TYPE_CHECKING:
    import numpy as np

MAX_CHUNK_CHARS = 300  # bounds memory per inference step whatever the text length
PIPER_RUNTIMES = ("onnxruntime", "torch")
ENGINES = registry.ENGINES  # the shipped ones (compatibility); registry.installed() has the rest


def _remove(path: str | None) -> None:
    if path:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


@dataclass
class _Job:
    """One request, planned and bound to its engine."""

    request: SynthesisRequest
    plan: Plan
    engine: Engine
    split_language: str
    sentences: int
    native_rate: int
    out_rate: int
    # The text as spoken: the request's with its pronunciation dictionaries applied (synth.lexicon);
    # ``rewrite.to_source`` maps its positions back to the submitted text.
    rewrite: Rewrite
    # The sentence cache (synth.cache): None renders every sentence; ``cache_basis`` keys this job's.
    cache: SentenceStore | None = None
    cache_basis: str = ""
    cache_stats: CacheStats = field(default_factory=CacheStats)
    timeline: Timeline | None = None  # the words' and sentences' timestamps (synth.timestamps)

    def chunks(self) -> Iterator[str]:
        return split_sentences(self.rewrite.text, self.split_language, MAX_CHUNK_CHARS)


class Synthesizer:
    """Loads engines on a device and turns requests into audio files.

    ``piper_runtime`` runs Piper voices on ``onnxruntime`` (default) or
    ``torch`` (fp16 and batching on CUDA; docs/decisions.md says which to use where).
    ``batch_jobs`` > 1 (torch only): ``synthesize`` called from that many threads at
    once puts their sentences into shared batches, waiting at most ``batch_wait_ms``
    for a batch to fill (synth.batching; docs/gpu.md).
    """

    def __init__(
        self,
        device: str = "cpu",
        voices_dir: str | None = None,
        engines: list[str] | None = None,
        threads: int | None = None,
        piper_runtime: str = "onnxruntime",
        batch_jobs: int = 1,
        batch_wait_ms: float = 5.0,
        solo_threads: int | None = None,
        busy: Callable[[], bool] | None = None,
        model_cache_dir: str | None = None,
        tolerant: bool = False,
        models_dir: str | None = None,
    ) -> None:
        """``tolerant`` (a worker): an engine that is not installed or fails to load is noted in
        ``unavailable`` and the others serve; otherwise it is an error at once.

        ``solo_threads`` and ``busy``: Piper (onnxruntime) uses that many inference threads
        for a sentence while ``busy()`` says no other job runs on the host (synth.hostjobs).
        ``model_cache_dir``: where Piper keeps its voices patched to report durations (word timestamps)."""
        self.device = device
        self.voices_dir = voices_dir
        self.engine_names = list(engines) if engines else list(registry.installed())
        self.tolerant = tolerant
        if not tolerant:
            for e in self.engine_names:
                registry.plugin(e)  # raises ValueError naming the installed engines
        if piper_runtime not in PIPER_RUNTIMES:
            raise ValueError(f"unknown Piper runtime {piper_runtime!r}; known: {', '.join(PIPER_RUNTIMES)}")
        self.piper_runtime = piper_runtime
        self.options = EngineOptions(
            voices_dir=voices_dir,
            threads=threads,
            piper_runtime=piper_runtime,
            batch_jobs=batch_jobs,
            batch_wait_ms=batch_wait_ms,
            solo_threads=solo_threads,
            busy=busy,
            model_cache_dir=model_cache_dir,
            models_dir=models_dir,
        )
        self.batch = (batch_jobs, batch_wait_ms)
        self.threads = threads
        self.solo = (solo_threads, busy)
        self.model_cache_dir = model_cache_dir
        self.models_dir = models_dir
        # engine -> {"model", "checksum"} of the verified model directory it runs (synth.models).
        self.model_info: dict[str, dict[str, str]] = {}
        self._engines: dict[str, Engine] = {}
        # Engines this synthesizer could not load (name -> why): ``load(tolerant=True)`` serves the rest.
        self.unavailable: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- engines ---------------------------------------------------------------------------
    def _new_engine(self, name: str) -> Engine:
        return registry.plugin(name).create(
            replace(self.options, model_dir=self._model_dir(name), engine=name)
        )

    def _model_dir(self, name: str) -> str | None:
        """``models_dir/<name>`` when it exists, only if verified and unchanged since (raises
        EngineUnavailable naming the command that verifies it); None when there is none."""
        from synth import models

        if not self.models_dir:
            return None
        directory = Path(self.models_dir) / name
        if not directory.is_dir():
            return None
        record = models.recorded(directory)
        if record is None:
            raise EngineUnavailable(
                f"model directory {directory} is not verified, or changed since it was: "
                f"run `manage.py models verify {name}`"
            )
        self.model_info[name] = {"model": name, "checksum": str(record.get("checksum") or "")}
        return str(directory)

    def capabilities(self, name: str) -> dict[str, Any]:
        """What engine ``name`` can do (synth.engines.base.CAPABILITY_DEFAULTS), as its plugin declares."""
        return registry.with_defaults(registry.plugin(name).capabilities(replace(self.options, engine=name)))

    def _engine_device(self, name: str) -> str:
        """The worker's device where the engine runs there, else the CPU (eSpeak on a GPU worker)."""
        devices = self.capabilities(name)["devices"]
        if self.device == "cpu" or any(self.device.startswith(str(d)) for d in devices):
            return self.device
        if self.device == "auto":
            return "auto" if any(str(d).startswith("cuda") for d in devices) else "cpu"
        return "cpu"

    def engine(self, name: str) -> Engine:
        with self._lock:
            eng = self._engines.get(name)
            if eng is None:
                if name not in self.engine_names:
                    raise UnknownVoice(f"engine {name!r} is not served here")
                if name in self.unavailable:
                    raise EngineUnavailable(f"engine {name} could not be loaded: {self.unavailable[name]}")
                eng = self._new_engine(name)
                eng.load(self._engine_device(name), [])
                self._engines[name] = eng
            return eng

    def load(self, voice_ids: list[str] | None = None, tolerant: bool | None = None) -> None:
        """Load engines (and the given voices, or every voice) up front.

        ``tolerant``: an engine that fails to load (its package broken, its model missing, more
        memory than ``memory_limit_mb`` allows) is noted in ``unavailable`` and the others load; the
        error is raised only when none loads. Otherwise the first failure is raised.
        """
        tolerant = self.tolerant if tolerant is None else tolerant
        errors: list[BaseException] = []
        for name in self.engine_names:
            wanted: list[str] | None = None
            try:
                if voice_ids is not None:
                    wanted = [v for v in voice_ids if self._serves(v, name)]
                    if not wanted:
                        continue
                    for v in wanted:
                        self.voice(v)  # raises UnknownVoice
                self._check_memory(name)
                with self._lock:
                    eng = self._engines.get(name) or self._new_engine(name)
                    eng.load(self._engine_device(name), wanted)
                    self._engines[name] = eng
                self.unavailable.pop(name, None)
            except Exception as exc:
                if not tolerant:
                    raise
                self.unavailable[name] = f"{type(exc).__name__}: {exc}"[:500]
                errors.append(exc)
        if tolerant and errors and not self._engines:
            raise errors[0]

    memory_limit_mb: float | None = None  # a worker child's RSS limit: a model needing more is not loaded

    def _check_memory(self, name: str) -> None:
        need = float(self.capabilities(name).get("memory_mb") or 0)
        if self.memory_limit_mb and need > self.memory_limit_mb:
            raise EngineUnavailable(
                f"a loaded {name} model needs {need:g} MB, more than this child's limit of "
                f"{self.memory_limit_mb:g} MB (TTS_WORKER_MAX_RSS_MB)"
            )

    def _serves(self, voice_id: str, engine: str) -> bool:
        return registry.engine_of(voice_id, self.voices_dir, [engine]) == engine

    def warm_up(self) -> None:
        """One short synthesis per loaded engine, so the first request is not the slow one.

        Not a remote model's: its model runs upstream, warm already, and a sentence sent at every
        child's start would spend the upstream's GPU on nobody (its load checked each replica)."""
        from synth.engines.base import VoiceParams

        for name, eng in list(self._engines.items()):
            ids = [v.id for v in eng.voices()]
            if not ids or getattr(eng, "remote", False):
                continue
            preferred = getattr(registry.plugin(name), "warm_up_voice", None)
            vid = preferred if preferred in ids else ids[0]
            for _ in eng.synthesize(["Hello."], VoiceParams(voice=vid)):
                pass

    def served_engines(self) -> list[str]:
        """The engines named here less those that could not be loaded."""
        return [e for e in self.engine_names if e not in self.unavailable]

    def voices(self) -> list[VoiceInfo]:
        served = self.served_engines()
        return list_voices(self.voices_dir, served) if served else []

    def voice(self, voice_id: str) -> VoiceInfo:
        served = self.served_engines()
        if not served:
            raise UnknownVoice(f"unknown voice {voice_id!r}")
        return get_voice(voice_id, self.voices_dir, served)

    def _served_voice(self, voice_id: str) -> VoiceInfo | None:
        return next((v for v in self.voices() if v.id == voice_id), None)

    # -- synthesis -------------------------------------------------------------------------------
    def plan(self, request: SynthesisRequest) -> Plan:
        """Resolve the voice and the controls (raises on a request the voice cannot serve)."""
        voice = self.voice(request.voice)
        seeded = bool(self.capabilities(voice.engine).get("seed")) if request.seed is not None else None
        return plan_controls(request, voice, self._served_voice, seeded=seeded)

    def _prepare(self, request: SynthesisRequest, cache: SentenceStore | None = None) -> _Job:
        from synth.audio import output_rate

        plan = self.plan(request)
        eng = self.engine(plan.voice.engine)
        plan.not_applied.extend(eng.notes(plan.params))
        chinese = is_chinese_language(plan.voice.language) or detect_language(request.text) == "zh"
        split_language = "zh" if chinese else "en"
        rewrite = self._apply_dictionaries(request, plan)
        sentences = sum(1 for _ in split_sentences(rewrite.text, split_language, MAX_CHUNK_CHARS))
        if sentences == 0:
            raise InvalidText("text has nothing speakable")
        native = int(eng.sample_rate(plan.voice.id))
        out_rate = output_rate(request.format, request.sample_rate, native)
        job = _Job(request, plan, eng, split_language, sentences, native, out_rate, rewrite)
        if cache is not None:
            job.cache = cache
            job.cache_basis = key_basis(
                plan.voice, plan.params, native, plan.voice.engine, self.piper_runtime
            )
        return job

    @staticmethod
    def _apply_dictionaries(request: SynthesisRequest, plan: Plan) -> Rewrite:
        """The request's dictionaries applied before sentences (and their cache keys) are made.

        Phoneme rules need a voice speaking their language (ARPAbet and IPA English, pinyin
        Chinese); the others are reported not applied, as instructions are.
        """
        language = (plan.params.language or plan.voice.language or "").lower()
        rewrite = apply_lexicons(
            request.text,
            list(request.dictionaries),
            english=language.startswith("en"),
            chinese=is_chinese_language(language),
        )
        plan.applied.extend(rewrite.applied)
        plan.not_applied.extend(rewrite.not_applied)
        return rewrite

    @staticmethod
    def _audio_with_gaps(
        job: _Job, progress: ProgressFn | None, should_cancel: CancelFn | None, stream: StreamWriter | None
    ) -> Iterator[np.ndarray]:
        """The engine's audio, sentence by sentence, with the silence between sentences."""
        import numpy as np

        gap = np.zeros(int(round(job.plan.silence * job.native_rate)), dtype=np.float32)
        chunks = list(job.chunks())
        if stream is not None:
            stream.open(job.out_rate, sum(len(c) for c in chunks))
        # Per sentence the engine rendered, in order: its words' timings (engines that know them).
        timings: list[Any] | None = [] if getattr(job.engine, "word_timings", False) else None
        timed: dict[str, Any] = {} if timings is None else {"timings": timings}
        job.timeline = Timeline(
            job.request.text, job.rewrite.text, job.rewrite.source_spans(), job.native_rate
        )
        if job.cache is None:
            audio = job.engine.synthesize(
                iter(chunks),
                job.plan.params,
                progress=progress,
                should_cancel=should_cancel,
                total=job.sentences,
                **timed,
            )
        else:
            # Only the sentences the cache lacks go to the engine; the key is the text the engine gets
            # (after the dictionaries), hits are the stored samples, the gaps are added below as ever.
            audio = cached_sentences(
                chunks,
                [sentence_key(job.cache_basis, c) for c in chunks],
                job.cache,
                lambda misses, total: job.engine.synthesize(
                    misses, job.plan.params, should_cancel=should_cancel, total=total, **timed
                ),
                job.native_rate,
                job.cache_stats,
                progress=progress,
                should_cancel=should_cancel,
                # The sidecar of a sentence just rendered: its word timings, relative to it.
                meta_of=lambda _i: {"words": timings[-1]} if timings else None,
            )
        rendered = 0
        for i, sentence in enumerate(audio):
            if i and gap.size:
                yield gap
                job.timeline.gap(gap.size)
            if isinstance(sentence, Pieces):  # written part by part as the engine receives it
                length = 0
                for part in sentence:
                    length += len(part)
                    yield part
                    if stream is not None:  # encoded by now: streaming readers may send it
                        stream.part_written()
            else:
                length = len(sentence)
                yield sentence
            if i in job.cache_stats.meta:  # a cache hit: the timings stored with it
                meta = job.cache_stats.meta[i]
                words = meta.get("words") if isinstance(meta, dict) else None
            else:
                words = timings[rendered] if timings is not None and rendered < len(timings) else None
                rendered += 1
            event = job.timeline.sentence(chunks[i], length, words)
            if stream is not None:  # its audio is written by now: what a partial charge counts
                stream.timestamps(event)
                stream.sentence_done(len(chunks[i]))

    def _encode(
        self,
        job: _Job,
        path: str,
        progress: ProgressFn | None,
        should_cancel: CancelFn | None,
        stream: StreamWriter | None = None,
    ) -> int:
        """Synthesise and encode into ``path``; the number of frames written."""
        import numpy as np

        from synth.audio import Encoder, StreamResampler, write_normalized
        from synth.engines.base import check_cancel

        resampler = StreamResampler(job.native_rate, job.out_rate)
        encoder = Encoder(path, job.request.format, job.out_rate, tap=stream.audio if stream else None)
        try:
            blocks = self._audio_with_gaps(job, progress, should_cancel, stream)
            target = job.request.loudness_lufs
            if target is None:
                for block in blocks:
                    encoder.write(resampler.process(block))
            else:
                write_normalized(
                    blocks,
                    lambda block: encoder.write(resampler.process(block)),
                    job.native_rate,
                    target,
                    path + ".f32",
                    before_block=lambda: check_cancel(should_cancel),
                )
            encoder.write(resampler.process(np.zeros(0, dtype=np.float32), last=True))
            encoder.close()
        except BaseException:
            encoder.abort()
            raise
        return encoder.frames

    def synthesize(
        self,
        request: SynthesisRequest,
        out_path: str,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        stream: StreamWriter | None = None,
        cache: SentenceStore | None = None,
    ) -> SynthesisResult:
        """Synthesise into ``out_path``; ``stream`` also gets the audio as it is encoded (synth.stream).

        ``cache``: a sentence store (synth.cache); sentences found there are not rendered again.
        """
        from synth.batching import recording
        from synth.telemetry import PeakMemory

        started = time.monotonic()
        job = self._prepare(request, cache)
        out_path = os.path.abspath(out_path)
        directory, base = os.path.split(out_path)
        tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.part")
        with PeakMemory(job.engine.device) as mem, recording() as batches:
            try:
                frames = self._encode(job, tmp, progress, should_cancel, stream)
                if frames == 0:
                    raise InvalidText("the text produced no audio")
                os.replace(tmp, out_path)
            except BaseException:
                _remove(tmp)
                if stream is not None:
                    stream.close()
                raise
        if stream is not None:
            stream.finish()
        elapsed = time.monotonic() - started
        duration = frames / job.out_rate
        return SynthesisResult(
            path=out_path,
            format=request.format,
            sample_rate=job.out_rate,
            duration_seconds=duration,
            bytes=os.path.getsize(out_path),
            chunks=job.sentences,
            synth_ms=int(elapsed * 1000),
            rtf=elapsed / duration if duration else 0.0,
            peak_rss_mb=round(mem.peak_rss_mb, 1),
            # Batched: the largest peak of the batches the job was in (jobs running at once share the device).
            peak_gpu_mb=mem.peak_gpu_mb if batches.peak_mb is None else round(batches.peak_mb, 1),
            engine=job.plan.voice.engine,
            device=job.engine.device,
            voice=job.plan.voice.id,
            applied=job.plan.applied,
            not_applied=job.plan.not_applied,
            batch_sizes=batches.sizes,
            cached_characters=job.cache_stats.cached_characters,
            cached_sentences=job.cache_stats.hits,
            dictionaries=job.rewrite.dictionaries,
            timestamps=job.timeline.result() if job.timeline is not None else None,
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
