"""Stopping a worker: a job still running when the stop grace runs out goes back to the queue, uncounted."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.reliability.helpers import (
    PIPER,
    flush_queues,
    job,
    make_org,
    media_root,
    partial_files,
    start_worker,
    submit,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = 2
# About 6 s of Piper synthesis on two idle cores: well beyond the grace once it has started.
VERY_LONG = " ".join(
    f"Sentence number {i} keeps this worker busy for a good while longer." for i in range(30)
)


def test_a_job_cut_off_by_the_stop_grace_is_requeued_without_counting_an_attempt(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "w-stop", engines="piper", TTS_WORKER_STOP_GRACE=str(GRACE))
    assert worker.process is not None
    org = make_org("stopping")
    queued = submit(org, VERY_LONG, voice=PIPER)
    row = wait_until(
        lambda: (r := job(queued.id)).status == "running" and r.progress > 0 and r,
        60,
        "the job to be running",
    )
    assert row.attempts == 1

    stopped_at = time.monotonic()
    os.kill(worker.process.pid, signal.SIGTERM)  # the Celery parent only, as the stack and systemd do
    try:
        worker.process.wait(GRACE + 20)
    except subprocess.TimeoutExpired:
        stack.stop_service(worker, signal.SIGKILL)
        raise AssertionError("the worker did not stop after its grace") from None
    took = time.monotonic() - stopped_at
    stack.stop_service(worker)  # bookkeeping only: it has exited

    row = job(queued.id)
    assert (row.status, row.attempts, row.worker) == ("queued", 0, ""), (row.status, row.stage)
    assert row.dispatched_at is not None  # its message is on the queue again
    assert GRACE <= took < GRACE + 20
    assert not partial_files(os.path.join(media_root(), "audio", str(org.id)))

    successor = start_worker(stack, "w-next", engines="piper")
    try:
        (done,) = wait_status([queued.id], timeout=120)
        assert (done.status, done.attempts) == ("succeeded", 1)
    finally:
        stack.stop_service(successor)
    print(f"\nworker stopped {took:.1f} s after SIGTERM with a grace of {GRACE} s; the job was handed back")
