"""The sentence batcher: jobs in threads share batched calls, each gets its own result or error."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from synth import DEFAULT_VOICE, SynthesisRequest, Synthesizer
from synth.batching import SentenceBatcher, recording
from synth.errors import SynthError

TEXTS = [
    "The first job speaks two sentences. This is its second one.",
    "Job two is here. It also has a second sentence.",
    "A third job, with one sentence only.",
    "The fourth job. Short. Done.",
]


def _doubler(calls: list[list[int]]) -> Any:
    def run(items: list[int]) -> tuple[list[Any], float | None]:
        calls.append(list(items))
        return [SynthError(f"{i} fails") if i < 0 else i * 2 for i in items], 7.0

    return run


def _as_members(batcher: SentenceBatcher[int, int], items: list[int]) -> list[Any]:
    """Each item submitted by its own thread, all of them members (synthesising) from the start."""
    ready = threading.Barrier(len(items))

    def one(item: int) -> Any:
        with batcher.member(), recording() as record:
            ready.wait()
            try:
                return batcher.submit(item), record.sizes, record.peak_mb
            except SynthError as exc:
                return exc

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(one, items))


def test_a_batch_closes_when_every_member_waits_and_each_caller_gets_its_own_result() -> None:
    calls: list[list[int]] = []
    batcher: SentenceBatcher[int, int] = SentenceBatcher(_doubler(calls), max_items=8, wait_s=30.0)
    started = time.monotonic()
    results = _as_members(batcher, [1, 2, 3, -4])
    # All four waited: the batch did not wait out its 30 s.
    assert time.monotonic() - started < 10
    assert calls and sorted(calls[0]) == [-4, 1, 2, 3]
    assert [r[0] for r in results[:3]] == [2, 4, 6]
    assert all(r[1] == [4] and r[2] == 7.0 for r in results[:3])
    assert isinstance(results[3], SynthError) and str(results[3]) == "-4 fails"


def test_a_batch_holds_at_most_max_items() -> None:
    calls: list[list[int]] = []
    batcher: SentenceBatcher[int, int] = SentenceBatcher(_doubler(calls), max_items=2, wait_s=5.0)
    results = _as_members(batcher, [1, 2, 3, 4, 5])
    assert [r[0] for r in results] == [2, 4, 6, 8, 10]
    assert max(len(c) for c in calls) == 2 and sum(len(c) for c in calls) == 5


def test_a_lone_sentence_waits_no_longer_than_the_wait() -> None:
    calls: list[list[int]] = []
    batcher: SentenceBatcher[int, int] = SentenceBatcher(_doubler(calls), max_items=8, wait_s=0.2)
    with batcher.member(), batcher.member():  # two jobs synthesising, only one asks
        started = time.monotonic()
        assert batcher.submit(5) == 10
    assert 0.15 <= time.monotonic() - started < 5


def test_a_failed_call_fails_every_sentence_in_it_and_the_batcher_keeps_serving() -> None:
    def run(items: list[int]) -> tuple[list[Any], float | None]:
        if 0 in items:
            raise RuntimeError("device lost")
        return list(items), None

    batcher: SentenceBatcher[int, int] = SentenceBatcher(run, max_items=4, wait_s=0.0)
    with pytest.raises(RuntimeError, match="device lost"):
        batcher.submit(0)
    assert batcher.submit(3) == 3


class OutOfMemoryError(RuntimeError):
    """Named as torch.cuda's is: the batcher recognises it by name, torch is not imported there."""


def test_a_batch_that_runs_out_of_memory_tries_each_sentence_alone_first() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> tuple[list[Any], float | None]:
        calls.append(list(items))
        if len(items) > 1:
            raise OutOfMemoryError("CUDA out of memory")
        if items == [9]:
            raise OutOfMemoryError("CUDA out of memory")  # too big even alone
        return [i * 2 for i in items], None

    batcher: SentenceBatcher[int, int] = SentenceBatcher(run, max_items=4, wait_s=5.0)
    outcomes = _as_members_raising(batcher, [1, 2, 9])
    assert sorted(len(c) for c in calls) == [1, 1, 1, 3], calls  # one batch of 3, then each alone
    results = dict(zip([1, 2, 9], outcomes, strict=True))
    assert results[1] == (2, [1]) and results[2] == (4, [1])
    assert isinstance(results[9], OutOfMemoryError)  # only the sentence that fails alone gets it


def _as_members_raising(batcher: SentenceBatcher[int, int], items: list[int]) -> list[Any]:
    ready = threading.Barrier(len(items))

    def one(item: int) -> Any:
        with batcher.member(), recording() as record:
            ready.wait()
            try:
                return batcher.submit(item), record.sizes
            except OutOfMemoryError as exc:
                return exc

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(one, items))


@pytest.fixture(scope="module")
def unbatched() -> Synthesizer:
    synth = Synthesizer(threads=1, engines=["piper"], piper_runtime="torch")
    synth.load([DEFAULT_VOICE])
    return synth


def _read(path: str) -> np.ndarray:
    import soundfile

    audio, _ = soundfile.read(path, dtype="float32")
    return np.asarray(audio)


@pytest.mark.slow  # seconds of work: make test runs it, make test-fast leaves it out
def test_concurrent_jobs_on_a_batching_synthesizer_sound_as_they_do_alone(
    unbatched: Synthesizer, tmp_path: Any
) -> None:
    batching = Synthesizer(
        threads=1, engines=["piper"], piper_runtime="torch", batch_jobs=4, batch_wait_ms=2000
    )
    batching.load([DEFAULT_VOICE])
    requests = [
        SynthesisRequest(text=t, voice=DEFAULT_VOICE, format="wav", seed=11 + n) for n, t in enumerate(TEXTS)
    ]
    ready = threading.Barrier(len(requests))

    def one(n: int) -> Any:
        ready.wait()
        return batching.synthesize(requests[n], str(tmp_path / f"batched-{n}.wav"))

    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(one, range(len(requests))))
    assert max(size for r in results for size in r.batch_sizes) > 1, [r.batch_sizes for r in results]
    for n, result in enumerate(results):
        assert len(result.batch_sizes) == result.chunks
        alone = unbatched.synthesize(requests[n], str(tmp_path / f"alone-{n}.wav"))
        assert alone.batch_sizes == []
        a, b = _read(result.path), _read(alone.path)
        assert a.shape == b.shape
        assert float(np.max(np.abs(a - b))) < 1e-3


@pytest.mark.parametrize(
    "fault", [RuntimeError("kernel failed"), MemoryError("fault injection: out of memory")]
)
def test_a_sentence_whose_pass_fails_fails_alone(
    unbatched: Synthesizer, monkeypatch: pytest.MonkeyPatch, fault: Exception
) -> None:
    from synth.engines import vits_torch
    from synth.engines.base import VoiceParams

    engine: Any = unbatched.engine("piper")
    params = VoiceParams(voice=DEFAULT_VOICE, noise_scale=0.0, noise_w=0.0)
    bad = "This sentence breaks its pass."
    voice = engine._voice(DEFAULT_VOICE)
    bad_ids = list(voice.piper.phonemes_to_ids(voice.phonemize(engine.render(bad, params))[0]))
    real = vits_torch.infer

    def infer(model: Any, utterances: list[Any], *args: Any) -> Any:  # the injected fault
        if any(list(u.phoneme_ids) == bad_ids for u in utterances):
            raise fault
        return real(model, utterances, *args)

    monkeypatch.setattr(vits_torch, "infer", infer)
    outcome = engine.synthesize_batch([(TEXTS[2], params), (bad, params), (TEXTS[3], params)])
    first, failed, last = outcome.results
    assert isinstance(first, np.ndarray) and first.size > 10_000
    assert isinstance(last, np.ndarray) and last.size > 10_000
    if isinstance(fault, MemoryError):
        assert failed is fault  # out of memory stays out of memory: the worker re-queues the job
    else:
        assert isinstance(failed, SynthError) and failed.code == "synthesis_failed"
