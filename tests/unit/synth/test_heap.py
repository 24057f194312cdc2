"""A worker's heap keeps freed inference memory while it works and gives it back when idle (synth.heap)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synth import heap

ROOT = Path(__file__).resolve().parents[3]

# Run in a process of its own: the tuning is process-wide (mallopt) and page faults are per process.
_PROBE = """
import json, resource, sys, time, psutil
from synth import heap
from synth.engines.base import VoiceParams
from synth.engines.piper import PiperEngine
if sys.argv[1] == "untuned":
    heap.keep_freed_memory = lambda: False
engine = PiperEngine(threads=1)
engine.load("cpu", ["en_US-joe-medium"])
params = VoiceParams(voice="en_US-joe-medium")
text = "The keeper climbed the stairs, trimmed the wick and watched the ships pass in the dark."
def job():
    for _ in engine.synthesize([text], params):
        pass
job()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    job()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
busy = psutil.Process().memory_info().rss / 2**20
time.sleep(heap.IDLE_TRIM_SECONDS + 0.5)
idle = psutil.Process().memory_info().rss / 2**20
print(json.dumps({"faults": faults, "busy_mb": busy, "idle_mb": idle}))
"""


def _probe(variant: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, variant],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_it_reuses_pages_between_jobs_and_returns_them_when_idle() -> None:
    tuned, untuned = _probe("tuned"), _probe("untuned")
    # Untuned, every sentence maps its tensors afresh (tens of thousands of faults).
    assert tuned["faults"] * 4 < untuned["faults"], (tuned, untuned)
    # What the heap kept for the next job goes back to the OS once the process idles.
    assert tuned["idle_mb"] < tuned["busy_mb"] - 50, tuned


@pytest.fixture
def trims(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Calls of the trim, with the tuning marked as in place and a short idle delay."""
    calls: list[float] = []
    monkeypatch.setattr(heap, "_configured", True)
    monkeypatch.setattr(heap, "IDLE_TRIM_SECONDS", 0.2)
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append(time.monotonic()))
    monkeypatch.setattr(heap, "_active", 0)
    monkeypatch.setattr(heap, "_sentences", 0)
    yield calls
    heap.job_started()  # calls off a timer this test left (monkeypatch then restores the count)


def test_it_trims_every_few_sentences_within_a_job(trims: list[float]) -> None:
    heap.job_started()
    for _ in range(heap.TRIM_EVERY * 2 + 1):
        heap.sentence_done()
    assert len(trims) == 2


def test_it_trims_once_the_process_has_idled(trims: list[float]) -> None:
    heap.job_started()
    heap.job_ended()
    time.sleep(0.5)
    assert len(trims) == 1


def test_a_new_job_calls_off_the_idle_trim(trims: list[float]) -> None:
    heap.job_started()
    heap.job_ended()
    heap.job_started()  # within the idle delay
    time.sleep(0.5)
    assert trims == []


def test_it_waits_for_every_job_of_the_process(trims: list[float]) -> None:
    heap.job_started()
    heap.job_started()
    heap.job_ended()  # the other still runs
    time.sleep(0.5)
    assert trims == []
    heap.job_ended()
    time.sleep(0.5)
    assert len(trims) == 1


def test_the_idle_trim_never_holds_up_exit(trims: list[float]) -> None:
    heap.job_started()
    heap.job_ended()
    timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
    assert timers and all(t.daemon for t in timers)
