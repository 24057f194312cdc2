"""A batching worker (torch runtime, TTS_WORKER_BATCH_JOBS=4): several jobs at once in one child.

Real worker, PostgreSQL, Redis and voice, on the CPU. Each job keeps its own
claim, progress, cancel and audio; their sentences share batched passes
(``metrics.batch_sizes``); a job whose sentence fails fails alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.stack import Service
from tests.reliability.helpers import (
    PIPER,
    flush_queues,
    job,
    make_org,
    media_root,
    start_worker,
    submit,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "Zebracorn"
OOM_MARKER = "Gigantosaur"  # a batched call holding it runs out of CUDA memory as a whole
OOM_RECORD: dict[str, Path] = {}  # where the fault notes each batch it failed
TEXTS = [
    "The first job has three sentences. It is the shortest one here. Goodbye now.",
    "Job number two speaks as well. Its second sentence is longer than its first one. That is all.",
    "A third job, in the same batches. Three sentences again. The end.",
    "The fourth and last job. It also joins the batches. Thank you for listening.",
]
# About twenty sentences: still running when its cancel arrives.
LONG = " ".join(f"Sentence {i} of the long job keeps the worker busy for a while." for i in range(1, 21))


@pytest.fixture(scope="module")
def batching_worker(
    stack: TestStack, django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    stack.stop_session_worker()
    flush_queues(stack, "synth.piper")
    worker = start_worker(
        stack,
        "w-batch",
        engines="piper",
        TTS_WORKER_PIPER_RUNTIME="torch",
        TTS_WORKER_BATCH_JOBS="4",
        TTS_WORKER_BATCH_WAIT_MS="300",
        TTS_WORKER_THREADS="1",
        TTS_FAULT_SENTENCE_MARKER=MARKER,
        TTS_FAULT_BATCH_OOM_MARKER=OOM_MARKER,
        TTS_FAULT_BATCH_OOM_RECORD=str(OOM_RECORD.setdefault("path", tmp_path_factory.mktemp("oom") / "oom")),
    )
    try:
        yield worker
    finally:
        stack.stop_service(worker)


@pytest.fixture(scope="module")
def unbatched() -> Any:
    from synth import Synthesizer

    synth = Synthesizer(threads=1, engines=["piper"], piper_runtime="torch")
    synth.load([PIPER])
    return synth


def _read(path: str) -> np.ndarray:
    import soundfile

    audio, _ = soundfile.read(path, dtype="float32")
    return np.asarray(audio)


def _submit_all(name: str, texts: list[str]) -> list[Any]:
    org = make_org(name)
    return [submit(org, text, voice=PIPER, seed=100 + n) for n, text in enumerate(texts)]


def test_four_jobs_share_batches_and_each_gets_its_own_audio(
    batching_worker: Service, builtin_voices: list[str], unbatched: Any, tmp_path: Any
) -> None:
    from synth import SynthesisRequest

    submitted = _submit_all("batch-four", TEXTS)
    rows = wait_status([j.id for j in submitted], timeout=150)
    assert [r.status for r in rows] == ["succeeded"] * 4, [(r.status, r.error_code) for r in rows]
    sizes = [r.metrics["batch_sizes"] for r in rows]
    assert all(len(s) == r.metrics["chunks"] == 3 for s, r in zip(sizes, rows, strict=True)), sizes
    assert max(max(s) for s in sizes) > 1, sizes
    assert [r.attempts for r in rows] == [1] * 4  # each its own first claim
    assert len({r.metrics["pid"] for r in rows}) == 1  # one child ran them all
    for n, row in enumerate(rows):
        request = SynthesisRequest(text=TEXTS[n], voice=PIPER, format="wav", seed=100 + n)
        alone = unbatched.synthesize(request, str(tmp_path / f"alone-{n}.wav"))
        got, expected = _read(os.path.join(media_root(), row.audio_path)), _read(alone.path)
        assert got.shape == expected.shape, n
        assert float(np.max(np.abs(got - expected))) < 1e-3, n


def test_a_canceled_job_in_the_batch_ends_canceled_and_the_others_succeed(
    batching_worker: Service, builtin_voices: list[str]
) -> None:
    from webapp.speech import lifecycle

    # One other job only: a batch of more than one sentence in its metrics held the canceled job's.
    submitted = _submit_all("batch-cancel", [LONG, TEXTS[0]])
    wait_until(lambda: job(submitted[0].id).progress > 0, 90, "the long job's first sentence")
    lifecycle.cancel_job(job(submitted[0].id))
    rows = wait_status([j.id for j in submitted], timeout=150)
    assert [r.status for r in rows] == ["canceled", "succeeded"], [(r.status, r.error_code) for r in rows]
    assert not rows[0].audio_path
    assert max(rows[1].metrics["batch_sizes"]) > 1, rows[1].metrics["batch_sizes"]


def test_a_job_whose_sentence_fails_fails_alone(batching_worker: Service, builtin_voices: list[str]) -> None:
    broken = f"This job starts well. Then {MARKER} breaks its second sentence. It never gets here."
    submitted = _submit_all("batch-fail", [TEXTS[0], broken, TEXTS[2], TEXTS[3]])
    rows = wait_status([j.id for j in submitted], timeout=150)
    assert [r.status for r in rows] == ["succeeded", "failed", "succeeded", "succeeded"], [
        (r.status, r.error_code) for r in rows
    ]
    assert rows[1].error_code == "synthesis_failed"
    assert not rows[1].audio_path
    assert max(max(r.metrics["batch_sizes"]) for r in (rows[0], rows[2], rows[3])) > 1


def test_a_batch_that_runs_out_of_memory_is_retried_sentence_by_sentence_first(
    batching_worker: Service, builtin_voices: list[str]
) -> None:
    """A batch-wide CUDA out-of-memory error (injected: the batched call raises
    torch.cuda.OutOfMemoryError while the marked sentence is in a batch of more than one)
    spends no job's only out-of-memory retry: each sentence is tried alone first."""
    # Every sentence of the second job is marked: whichever of them meets another job's in a
    # batch makes that batch fail (the group's first sentence runs alone, before others join).
    big = f"A {OOM_MARKER} starts this job. This {OOM_MARKER} does not fit. The {OOM_MARKER} ends."
    submitted = _submit_all("batch-oom", [TEXTS[0], big, *TEXTS[1:3]])
    rows = wait_status([j.id for j in submitted], timeout=150)
    assert [r.status for r in rows] == ["succeeded"] * 4, [(r.status, r.error_code) for r in rows]
    # The fault overlapped the batches: batches holding a marked sentence failed as a whole,
    # and their sentences then ran alone.
    failed = [int(n) for n in OOM_RECORD["path"].read_text().split()]
    assert failed and all(n > 1 for n in failed), failed
    assert 1 in rows[1].metrics["batch_sizes"], rows[1].metrics["batch_sizes"]
    assert [(r.attempts, r.oom_retries) for r in rows] == [(1, 0)] * 4
