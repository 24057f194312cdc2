"""Soft time limit, disk full, and a model that will not load: clear outcomes, no leftovers."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from tests.reliability.helpers import (
    ESPEAK,
    LONG,
    PIPER,
    SHORT,
    children,
    flush_queues,
    make_org,
    media_root,
    partial_files,
    start_worker,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import CFG, TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def test_soft_time_limit_fails_with_timeout_and_the_child_keeps_serving(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "w-timeout", engines="piper")
    try:
        org = make_org("timeout")
        # Limits are computed at dispatch (here) from the text length: 1 s for this job.
        with override_settings(TTS_JOB_BASE_SECONDS=1.0, TTS_JOB_SECONDS_PER_CHAR=0.0):
            slow = submit(org, " ".join([LONG] * 3), voice=PIPER)
        (row,) = wait_status([slow.id], timeout=60)
        assert row.status == "failed" and row.error_code == "timeout", (row.status, row.error_message)
        assert "1 s" in row.error_message
        assert usage_events(slow.id) == ["release", "reserve"]
        folder = os.path.join(media_root(), "audio", str(org.id))
        assert not os.path.isdir(folder) or os.listdir(folder) == []
        pid = row.worker.rpartition(":")[2]
        ok = submit(org, SHORT, voice=PIPER)
        (done,) = wait_status([ok.id], timeout=30)
        assert done.status == "succeeded"
        # The very child that timed out served the next job.
        assert str(done.metrics["pid"]) == pid
    finally:
        stack.stop_service(worker)


@pytest.fixture
def tiny_media_root() -> Iterator[str]:
    path = str(CFG.path("tmp", "tiny-media"))
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)


def test_disk_full_fails_clearly_leaves_nothing_and_keeps_serving(
    stack: TestStack, builtin_voices: list[str], tiny_media_root: str
) -> None:
    flush_queues(stack, "synth.piper", "synth.espeak")
    worker = start_worker(stack, "w-disk", engines="piper,espeak", TTS_MEDIA_ROOT=tiny_media_root)
    try:
        org = make_org("disk")
        # About 3.5 MB of WAV into 200 KiB.
        big = submit(org, LONG, voice=PIPER)
        (row,) = wait_status([big.id], timeout=60)
        assert row.status == "failed" and row.error_code == "disk_full", (
            row.status,
            row.error_code,
            row.error_message,
        )
        assert "full" in row.error_message
        assert usage_events(big.id) == ["release", "reserve"]
        assert partial_files(tiny_media_root) == []
        folder = os.path.join(tiny_media_root, "audio", str(org.id))
        assert os.listdir(folder) == []
        # Space is free again (nothing leaked), and the same worker serves a job that fits.
        small = submit(org, "Hi.", voice=ESPEAK)
        (done,) = wait_status([small.id], timeout=30)
        assert done.status == "succeeded", (done.error_code, done.error_message)
        assert os.listdir(folder) == [os.path.basename(done.audio_path)]
        assert worker.process is not None and worker.process.poll() is None
    finally:
        stack.stop_service(worker)


def test_model_load_failure_backs_off_instead_of_crash_looping(
    stack: TestStack, django_db_setup: None
) -> None:
    worker = start_worker(
        stack,
        "w-noload",
        engines="no-such-engine",
        wait_ready=False,
        TTS_WORKER_LOAD_BACKOFF_BASE="0.5",
        TTS_WORKER_LOAD_BACKOFF_MAX="2",
        TTS_WORKER_PROC_ALIVE_TIMEOUT="12",
    )
    try:
        beat = wait_until(
            lambda: [
                b
                for b in stack.heartbeats()
                if b.get("state") == "backoff" and b.get("engines") == ["no-such-engine"]
            ],
            30,
            "a backoff heartbeat",
        )[0]
        assert beat["next_retry_at"] > time.time() - 1
        assert "no-such-engine" in beat["error"]
        assert beat["voices"] == []
        first = beat["load_failures"]
        time.sleep(8)
        beats = [b for b in stack.heartbeats() if b.get("engines") == ["no-such-engine"]]
        failures = max(b["load_failures"] for b in beats)
        # Delays 0.5, 1, 2, 2, ... s: a handful of tries in 8 s, not a crash loop.
        assert first <= failures <= first + 7, (first, failures)
        assert all(b["state"] in ("backoff", "loading", "load_failed") for b in beats)
        # The Celery parent is alive and still has a child.
        assert worker.process is not None and worker.process.poll() is None
        assert children(worker)
    finally:
        stack.stop_service(worker)
        r = stack.redis_client()
        for key in r.scan_iter(match="tts:worker-node:*"):
            r.hdel(key, "load_failures")
