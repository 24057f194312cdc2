"""A real worker (piper + espeak) running real jobs: claim, progress, metrics, cancel, duplicates."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.stack import Service
from tests.reliability.helpers import (
    ESPEAK,
    LONG,
    PIPER,
    SHORT,
    children,
    flush_queues,
    job,
    make_org,
    media_root,
    partial_files,
    start_worker,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def worker(stack: TestStack, django_db_setup: None) -> Iterator[Service]:
    flush_queues(stack, "synth.piper", "synth.espeak")
    service = start_worker(stack, "worker-it", engines="piper,espeak", concurrency=1)
    try:
        yield service
    finally:
        stack.stop_service(service)


def test_job_runs_once_with_progress_metrics_and_its_file(worker: Service, builtin_voices: list[str]) -> None:
    org = make_org("it-run")
    j = submit(org, LONG, voice=PIPER)
    stages: set[str] = set()

    def finished() -> bool:
        row = job(j.id)
        stages.add(row.stage)
        return row.status in ("succeeded", "failed")

    wait_until(finished, 60, "the job to finish", interval=0.02)
    row = job(j.id)
    assert row.status == "succeeded", (row.error_code, row.error_message)
    assert row.progress == 1.0 and row.stage == "done"
    assert any(s.startswith("synthesising ") and "/" in s for s in stages), stages
    assert row.attempts == 1
    m = row.metrics
    for key in (
        "queue_ms",
        "synth_ms",
        "audio_seconds",
        "rtf",
        "peak_rss_mb",
        "peak_gpu_mb",
        "engine",
        "device",
        "worker",
    ):
        assert key in m, key
    assert m["engine"] == "piper" and m["device"] == "cpu"
    assert m["peak_gpu_mb"] is None  # CPU: no GPU reading, not a made-up zero
    assert m["audio_seconds"] > 20 and 0 < m["rtf"] < 1
    # host:<pid namespace>-<process start>-<random>:pid, unique per child start (issue 13)
    host, nonce, pid = m["worker"].split(":")
    assert (host, pid) == (m["host"], str(m["pid"])) and nonce.count("-") == 2
    assert m["pid"] in {p.pid for p in children(worker)}
    path = os.path.join(media_root(), row.audio_path)
    assert os.path.getsize(path) == row.audio_bytes > 0
    assert row.duration_seconds == pytest.approx(m["audio_seconds"], abs=0.01)
    assert usage_events(j.id) == ["charge", "reserve"]
    assert not partial_files(os.path.dirname(path))


def test_duplicate_message_for_a_finished_job_changes_nothing(
    worker: Service, builtin_voices: list[str]
) -> None:
    from webapp.speech.tasks import synthesize_job

    org = make_org("it-dup")
    j = submit(org, SHORT)
    (done,) = wait_status([j.id], timeout=30)
    assert done.status == "succeeded"
    # A redelivered copy (broker restart, visibility timeout) and a plain duplicate.
    for _ in range(2):
        synthesize_job.apply_async(args=(str(j.id),), queue="synth.espeak")
    marker = submit(org, SHORT)  # runs after the duplicates on the same single child
    wait_status([marker.id], timeout=30)
    again = job(j.id)
    assert again.finished_at == done.finished_at and again.attempts == 1
    assert again.metrics == done.metrics
    assert usage_events(j.id) == ["charge", "reserve"]


def test_cancel_stops_a_running_job_within_a_sentence(worker: Service, builtin_voices: list[str]) -> None:
    from webapp.speech import lifecycle

    org = make_org("it-cancel")
    j = submit(org, LONG, voice=PIPER)
    wait_until(lambda: job(j.id).stage.startswith("synthesising 2/"), 30, "the job to be mid-synthesis", 0.02)
    lifecycle.cancel_job(job(j.id))
    asked = time.monotonic()
    (row,) = wait_status([j.id], ["canceled", "succeeded"], timeout=30)
    took = time.monotonic() - asked
    assert row.status == "canceled"
    # A Piper sentence here takes well under a second on 2 cores.
    assert took < 3.0, took
    assert row.progress < 0.9
    assert usage_events(j.id) == ["release", "reserve"]
    folder = os.path.join(media_root(), "audio", str(org.id))
    leftovers = os.listdir(folder) if os.path.isdir(folder) else []
    assert leftovers == [], leftovers


def test_queued_job_canceled_never_starts(worker: Service, builtin_voices: list[str]) -> None:
    from webapp.speech import lifecycle

    org = make_org("it-cancel-queued")
    blocker = submit(org, LONG, voice=PIPER)
    queued = submit(org, SHORT, voice=PIPER)
    lifecycle.cancel_job(job(queued.id))
    assert job(queued.id).status == "canceled"
    wait_status([blocker.id], timeout=60)
    time.sleep(0.5)  # the queued job's message has been consumed by now
    row = job(queued.id)
    assert row.status == "canceled" and row.attempts == 0 and row.started_at is None
    assert usage_events(queued.id) == ["release", "reserve"]


def test_heartbeat_describes_the_child(stack: TestStack, worker: Service, builtin_voices: list[str]) -> None:
    pids = {p.pid for p in children(worker)}
    beats = [b for b in stack.heartbeats() if b.get("pid") in pids]
    assert len(beats) == 1
    beat: dict[str, Any] = beats[0]
    assert beat["state"] == "ready"
    for key in (
        "host",
        "pid",
        "device",
        "engines",
        "voices",
        "loaded_at",
        "tasks_done",
        "recycles",
        "recycle_reasons",
        "rss_mb",
        "gpu_mb",
        "rtf",
        "node",
    ):
        assert key in beat, key
    assert beat["device"] == "cpu" and beat["gpu_mb"] is None
    assert PIPER in beat["voices"] and ESPEAK in beat["voices"]
    assert beat["rss_mb"] > 50
    ttl = stack.redis_client().ttl(f"tts:heartbeat:{beat['worker_id']}")
    assert 0 < ttl <= 3


def test_engines_load_in_the_child_never_in_the_parent(worker: Service) -> None:
    assert worker.process is not None

    def mapped(pid: int) -> str:
        with open(f"/proc/{pid}/maps") as fh:
            return fh.read()

    parent = mapped(worker.process.pid)
    (child,) = children(worker)
    assert "onnxruntime" in mapped(child.pid)
    # Nothing of the inference runtimes (and so nothing of CUDA) before fork.
    assert "onnxruntime" not in parent and "libespeak" not in parent and "libcuda" not in parent
