"""Piper voices on PyTorch: the same voices and text handling as the onnxruntime engine.

Chosen per worker (``Synthesizer(piper_runtime="torch")``). What it adds over
onnxruntime: ``torch.inference_mode``, fp16 on CUDA (the duration predictor
stays float32), per-call peak memory (``torch.cuda.max_memory_allocated``
with the peak reset per call on CUDA, peak RSS on the CPU), seeded noise
that does not depend on batching, and :meth:`PiperTorchEngine.synthesize_batch`:
sentences of several jobs in one padded forward pass. Weights come from the
voice's own ``.onnx`` (synth/engines/vits_torch.py); nothing is downloaded.
The CUDA path is tested on CPU only until a GPU run is recorded in
docs/performance.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from synth.batching import SentenceBatcher
from synth.engines.base import CancelFn, ProgressFn, VoiceParams, check_cancel, resolve_device
from synth.engines.piper import PiperEngine, read_config
from synth.errors import Cancelled, EngineUnavailable, SynthError
from synth.heap import release_free_heap

if TYPE_CHECKING:
    import numpy as np
    import torch

DEFAULT_MAX_BATCH = 32


def resolve_torch_device(device: str) -> str:
    """``cpu``, ``cuda`` -> ``cuda:0``, ``cuda:N``, or ``auto`` (CUDA when torch has it)."""
    import torch

    resolved = resolve_device(device, torch.cuda.is_available)
    if resolved.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineUnavailable(
                f"device {device!r} asked for, but this torch has no CUDA ({torch.__version__})"
            )
        if int(resolved[5:]) >= torch.cuda.device_count():
            raise EngineUnavailable(f"device {device!r}: only {torch.cuda.device_count()} CUDA devices")
    return resolved


@dataclass
class _TorchVoice:
    """What the engine holds per voice: piper's phonemizer and config, and the torch model."""

    piper: Any  # piper.PiperVoice without an onnxruntime session (phonemizer and config)
    model: Any  # torch.nn.Module on the engine's device
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def config(self) -> Any:
        return self.piper.config

    def phonemize(self, text: str) -> list[list[str]]:
        return list(self.piper.phonemize(text))


@dataclass
class BatchOutcome:
    """One entry per request, in order: its audio, or the error that failed it alone.

    The error is a SynthError (``synthesis_failed`` for a pass that failed),
    except when the request ran out of memory on its own: then it is that
    error itself (``MemoryError``, ``torch.cuda.OutOfMemoryError``), so the
    caller can treat it as out-of-memory (the worker re-queues the job once
    on a fresh child).
    """

    results: list[np.ndarray | Exception]
    peak_memory_mb: float  # CUDA: max_memory_allocated over the batch; CPU: peak RSS of the process
    forward_passes: int


@dataclass(frozen=True)
class _Sentence:
    """One job's next sentence chunk, waiting in the batcher with the job's own seed stream."""

    text: str
    params: VoiceParams
    seeds: Any  # torch.Generator | None


class PiperTorchEngine(PiperEngine):
    name = "piper"

    def __init__(
        self,
        voices_dir: str | None = None,
        threads: int | None = None,
        batch_jobs: int = 1,
        batch_wait_ms: float = 5.0,
    ) -> None:
        """``batch_jobs`` > 1: concurrent ``synthesize`` calls (one thread per job) share batched passes."""
        super().__init__(voices_dir=voices_dir, threads=threads)
        self.dtype_name = "float32"
        self.last_peak_mb: float | None = None
        self.batcher: SentenceBatcher[_Sentence, np.ndarray] | None = None
        if batch_jobs > 1:
            self.batcher = SentenceBatcher(self._run_batch, batch_jobs, batch_wait_ms / 1000.0)

    # -- loading ---------------------------------------------------------------------------
    def _device_for(self, device: str) -> str:
        import torch

        resolved = resolve_torch_device(device)
        self.dtype_name = "float16" if resolved.startswith("cuda") else "float32"
        if self.threads and resolved == "cpu":
            torch.set_num_threads(self.threads)
        return resolved

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype_name)  # type: ignore[no-any-return]

    def _open(self, model_path: str, threads: int | None = None) -> _TorchVoice:
        """One model per voice: torch's threads are process-wide (``torch.set_num_threads``)."""
        from piper import PiperVoice

        from synth.engines import vits_torch

        model, _ = vits_torch.load_voice(model_path, model_path + ".json")
        vits_torch.place(model, self.device, self.dtype)
        return _TorchVoice(PiperVoice(session=None, config=read_config(model_path)), model)

    # -- synthesis -----------------------------------------------------------------------------
    def _utterances(self, voice: _TorchVoice, text: str, params: VoiceParams, seeds: Any) -> list[Any]:
        from synth.engines.vits_torch import Utterance

        noise_scale, length_scale, noise_w = self.scales(voice, params)
        return [
            Utterance(voice.piper.phonemes_to_ids(p), noise_scale, length_scale, noise_w, _generator(seeds))
            for p in voice.phonemize(text)
            if p
        ]

    @property
    def word_timings(self) -> bool:  # type: ignore[override]
        """Unbatched, synthesize() fills ``timings`` from the durations (batched jobs get sentences only)."""
        return self.batcher is None

    def _forward(
        self, voice: _TorchVoice, utterances: list[Any], max_batch: int, durations: list[Any] | None = None
    ) -> list[np.ndarray]:
        """Audio per utterance (peak-normalised like Piper's), shortest first in each pass;
        ``durations`` gets each utterance's frames per phoneme id, in order."""
        import torch

        from synth.engines.vits_torch import infer

        order = sorted(range(len(utterances)), key=lambda i: len(utterances[i].phoneme_ids))
        audio: list[Any] = [None] * len(utterances)
        frames: list[Any] = [None] * len(utterances)
        with voice.lock, torch.inference_mode():
            for start in range(0, len(order), max_batch):
                picked = order[start : start + max_batch]
                for i, out in zip(
                    picked,
                    infer(voice.model, [utterances[i] for i in picked], self.device, self.dtype),
                    strict=True,
                ):
                    audio[i] = _peak_normalised(out.audio)
                    frames[i] = out.durations
        if durations is not None:
            durations.extend(frames)
        return audio

    def _chunk_audio(
        self, voice: Any, text: str, params: VoiceParams, seeds: Any = None, aligned: list[Any] | None = None
    ) -> np.ndarray:
        """``aligned`` gets per Piper sentence (its audio, its (phoneme, samples)) as _aligned_pieces."""
        import numpy as np

        utterances = self._utterances(voice, text, params, seeds)
        frames: list[Any] | None = [] if aligned is not None else None
        pieces = self._forward(voice, utterances, DEFAULT_MAX_BATCH, frames) if utterances else []
        if aligned is not None and frames is not None:
            phonemes = [p for p in voice.phonemize(text) if p]  # as _utterances took them
            for piece, sentence, durations in zip(pieces, phonemes, frames, strict=True):
                aligned.append((piece, _phoneme_samples(voice.config, sentence, durations, len(piece))))
        return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)

    def _aligned_pieces(
        self, voice: Any, text: str, params: VoiceParams, chunk_audio: Any
    ) -> list[tuple[np.ndarray, list[tuple[str, int]] | None]]:
        out: list[tuple[np.ndarray, list[tuple[str, int]] | None]] = []
        if chunk_audio is None:
            self._chunk_audio(voice, text, params, None, out)
        else:
            chunk_audio(voice, text, params, out)  # the job's seed stream
        return out

    @contextmanager
    def _job(self, params: VoiceParams) -> Iterator[Callable[..., np.ndarray]]:
        """One job: its own seed stream, and its own CUDA memory peak."""
        seeds = _seed_stream(params.seed)

        def chunk_audio(
            voice: Any, text: str, p: VoiceParams, aligned: list[Any] | None = None
        ) -> np.ndarray:
            return self._chunk_audio(voice, text, p, seeds, aligned)

        with self._peak_memory(rss=False):
            yield chunk_audio

    def synthesize(
        self,
        chunks: Iterable[str],
        params: VoiceParams,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        total: int | None = None,
        timings: list[list[Any]] | None = None,
    ) -> Iterator[np.ndarray]:
        """As PiperEngine's; with a batcher, each chunk waits for the next batch of the jobs running now.

        ``timings`` (unbatched only: ``word_timings``) as PiperEngine's, from the durations of the
        torch model's own pass.
        """
        if self.batcher is None:
            yield from super().synthesize(chunks, params, progress, should_cancel, total, timings)
            return
        seeds = _seed_stream(params.seed)  # drawn in the job's order: the same noise as unbatched
        with self.batcher.member():
            for done, chunk in enumerate(chunks, 1):
                check_cancel(should_cancel)
                yield self.batcher.submit(_Sentence(chunk, params, seeds))
                if progress is not None:
                    progress(done, total if total is not None else done)

    def _run_batch(self, sentences: list[_Sentence]) -> tuple[list[Any], float | None]:
        """The batcher's call: one chunk per waiting job; the CUDA peak of the batch (None on the CPU)."""
        outcome = self.synthesize_batch(
            [(s.text, s.params) for s in sentences], seeds=[s.seeds for s in sentences]
        )
        release_free_heap()
        return outcome.results, outcome.peak_memory_mb if self.device.startswith("cuda") else None

    def synthesize_batch(
        self,
        requests: list[tuple[str, VoiceParams]],
        max_batch: int = DEFAULT_MAX_BATCH,
        seeds: list[Any] | None = None,
    ) -> BatchOutcome:
        """One sentence chunk per request (e.g. the next sentence of each waiting job), synthesised together.

        Requests may use different voices and controls; those of one voice share
        forward passes (padded, lengths masked) of up to ``max_batch`` Piper
        sentences. A request whose text fails, or whose pass fails, gets its
        own SynthError (a failed pass is retried one request at a time, so only
        the request that fails alone is failed); the others get their audio.
        ``seeds``: per request, the seed stream of its job (``_seed_stream``), so that
        a job's sentences draw the noise they draw unbatched; default: a new stream
        from each request's ``params.seed``.
        """
        results: list[np.ndarray | SynthError | None] = [None] * len(requests)
        passes = 0
        with self._peak_memory() as peak:
            by_voice: dict[str, list[int]] = {}
            for i, (_, params) in enumerate(requests):
                by_voice.setdefault(params.voice, []).append(i)
            streams = seeds if seeds is not None else [_seed_stream(p.seed) for _, p in requests]
            for indices in by_voice.values():
                passes += self._batch_one_voice(requests, indices, streams, results, max_batch)
        assert all(r is not None for r in results)
        return BatchOutcome(results, peak[0], passes)  # type: ignore[arg-type]

    def _batch_one_voice(
        self,
        requests: list[tuple[str, VoiceParams]],
        indices: list[int],
        seeds: list[Any],
        results: list[Any],
        max_batch: int,
    ) -> int:
        import math

        import numpy as np

        owners: list[int] = []
        utterances: list[Any] = []
        for i in indices:
            text, params = requests[i]
            try:
                voice = self._voice(params.voice)
                found = self._utterances(voice, self.render(text, params), params, seeds[i])
            except SynthError as exc:
                results[i] = exc
                continue
            if not found:  # nothing speakable in this chunk: no audio, as unbatched
                results[i] = np.zeros(0, np.float32)
                continue
            owners.extend([i] * len(found))
            utterances.extend(found)
        if not utterances:
            return 0
        voice = self._voice(requests[owners[0]][1].voice)
        try:
            audio = self._forward(voice, utterances, max_batch)
            passes = math.ceil(len(utterances) / max_batch)
        except (Cancelled, KeyboardInterrupt):
            raise
        except Exception:
            return self._one_by_one(voice, requests, owners, utterances, results)
        self._collect(voice, requests, owners, audio, results)
        return passes

    def _one_by_one(
        self,
        voice: _TorchVoice,
        requests: list[Any],
        owners: list[int],
        utterances: list[Any],
        results: list[Any],
    ) -> int:
        """After a failed batched pass: each request alone, so a failure stays with its request."""
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # after an out-of-memory, give the cached blocks back first
        for i in dict.fromkeys(owners):
            mine = [u for u, owner in zip(utterances, owners, strict=True) if owner == i]
            try:
                audio = self._forward(voice, mine, len(mine))
            except Exception as exc:
                results[i] = _request_error(exc)
                continue
            self._collect(voice, requests, [i] * len(mine), audio, results)
        return len(set(owners))

    def _collect(
        self, voice: _TorchVoice, requests: list[Any], owners: list[int], audio: list[Any], results: list[Any]
    ) -> None:
        import numpy as np

        sr = int(voice.config.sample_rate)
        for i in dict.fromkeys(owners):
            pieces = [a for a, owner in zip(audio, owners, strict=True) if owner == i]
            results[i] = self.finish(np.concatenate(pieces).astype(np.float32), requests[i][1], sr)

    @contextmanager
    def _peak_memory(self, rss: bool = True) -> Iterator[list[float]]:
        """Peak memory of the enclosed work, stored in ``last_peak_mb`` and yielded as ``[mb]``.

        CUDA: ``max_memory_allocated`` after a reset, so each call (each job, or
        each batch) has its own peak. CPU: the process's peak RSS when ``rss``
        (the Synthesizer already samples RSS around a whole job, so it passes False).
        """
        import torch

        from synth.telemetry import PeakMemory

        box = [0.0]
        if self.device.startswith("cuda"):
            index = int(self.device.split(":")[1])
            torch.cuda.reset_peak_memory_stats(index)
            try:
                yield box
            finally:
                box[0] = self.last_peak_mb = torch.cuda.max_memory_allocated(index) / 2**20
        elif rss:
            with PeakMemory("cpu") as mem:
                yield box
            box[0] = self.last_peak_mb = mem.peak_rss_mb
        else:
            yield box


def _phoneme_samples(
    config: Any, phonemes: list[str], frames: list[int], samples: int
) -> list[tuple[str, int]] | None:
    """(phoneme, samples) from frames per phoneme id, grouped as piper groups its alignments: each
    phoneme with the pad after it, BOS first, EOS last. None where the ids do not line up."""
    import itertools

    from piper.const import BOS, EOS, PAD

    id_map = config.phoneme_id_map
    pad = list(id_map.get(PAD, []))
    total = sum(frames) or 1
    out: list[tuple[str, int]] = []
    k = 0
    for phoneme in itertools.chain([BOS], phonemes, [EOS]):
        ids = list(id_map.get(phoneme, [])) + (pad if phoneme != EOS else [])
        if k + len(ids) > len(frames):
            return None
        out.append((phoneme, int(round(sum(frames[k : k + len(ids)]) * samples / total))))
        k += len(ids)
    return out if k == len(frames) else None


def _request_error(exc: Exception) -> Exception:
    """What a request whose pass failed on its own gets (see BatchOutcome)."""
    if isinstance(exc, SynthError | MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return exc
    return SynthError(f"synthesis failed: {exc}", code="synthesis_failed")


def _peak_normalised(audio: np.ndarray) -> np.ndarray:
    """As piper's ``normalize_audio``: each sentence scaled to a peak of 1."""
    import numpy as np

    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    out: np.ndarray = np.zeros_like(audio) if peak < 1e-8 else np.clip(audio / peak, -1.0, 1.0)
    return out.astype(np.float32)


def _seed_stream(seed: int | None) -> torch.Generator | None:
    """A job's source of per-sentence seeds (None: torch's global RNG)."""
    if seed is None:
        return None
    import torch

    return torch.Generator().manual_seed(int(seed))


def _generator(seeds: torch.Generator | None) -> torch.Generator | None:
    """The next sentence's own RNG: its noise then does not depend on what it is batched with."""
    if seeds is None:
        return None
    import torch

    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=seeds)))
