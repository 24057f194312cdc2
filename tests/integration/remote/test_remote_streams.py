"""Many upstream streams in one worker process (issue 57, item 3): a remote model's jobs run in
threads of one child (runtime/batching.py), so 64 of them are relayed at once by one process, in
well under 1 GiB; and a job in a thread still stops at its hard limit, which has no alarm there."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.reliability.helpers import make_org, start_worker, submit, wait_status
from tests.stack import TestStack
from tests.upstream.harness import Upstream, prepare_clients, start_upstream

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "cosyvoice3"
VOICE = f"{MODEL}:alloy"
STREAMS = 64
MEMORY_LIMIT_MB = 1024
SENTENCE = "One sentence for the relay to carry."


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    prepare_clients()
    server = start_upstream(tmp_path_factory.mktemp("upstream") / "s.log", "--replica", "s", "--model", MODEL)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def worker(stack: TestStack, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One worker with one child; the models file's defaults (64 jobs a process) but for the replica's
    cap, which lets all of them reach the one replica at once."""
    path = tmp_path_factory.mktemp("remote") / "remote-models.json"
    model = {"upstreams": [upstream.url], "voices": [{"id": "alloy"}], "streams_per_upstream": STREAMS}
    path.write_text(json.dumps({"models": {MODEL: model}}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TTS_REMOTE_MODELS_FILE", str(path))
        service = start_worker(stack, "remote-streams", engines=MODEL, TTS_REMOTE_MODELS_FILE=str(path))
        try:
            yield service
        finally:
            stack.stop_service(service)


@pytest.fixture
def voices(db: None, worker: Any, upstream: Upstream) -> None:
    from synth.registry import list_voices
    from webapp.speech.voices import sync_builtin_voices

    sync_builtin_voices(list_voices(engines=[MODEL]))
    upstream.control(hang=False, chunk_delay_ms=0)


def the_child(worker: Any) -> psutil.Process:
    (child,) = psutil.Process(worker.process.pid).children()  # a prefork pool of one
    return child


def test_one_child_relays_64_streams_at_once_in_under_1_gib(
    voices: None, worker: Any, upstream: Upstream
) -> None:
    # Each stream lasts 4 s upstream: long enough for the child to claim and send all of them.
    upstream.control(chunk_delay_ms=4000)
    parent, child = psutil.Process(worker.process.pid), the_child(worker)
    orgs = [make_org(f"streams-{i}") for i in range(4)]
    jobs = [submit(orgs[i % len(orgs)], SENTENCE, voice=VOICE, lane="interactive") for i in range(STREAMS)]
    peak_streams, peak_mb, peak_threads = 0, 0.0, 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        peak_streams = max(peak_streams, int(upstream.stats()["in_flight"]))
        worker_mb = (parent.memory_info().rss + child.memory_info().rss) / 2**20
        peak_mb, peak_threads = max(peak_mb, worker_mb), max(peak_threads, child.num_threads())
        if peak_streams >= STREAMS:
            break
        time.sleep(0.1)
    rows = wait_status([j.id for j in jobs], timeout=60)
    print(f"\n{peak_streams} streams at once; worker RSS {peak_mb:.0f} MB; child threads {peak_threads}")
    assert peak_streams == STREAMS  # every job's stream open at once, from one process
    assert [r.status for r in rows] == ["succeeded"] * STREAMS, {(r.status, r.error_code) for r in rows}
    assert {r.metrics["pid"] for r in rows} == {child.pid}  # the one child ran them all
    assert psutil.Process(worker.process.pid).children() == [child]  # and still is the only one
    assert peak_mb <= MEMORY_LIMIT_MB
    assert peak_threads > STREAMS  # threads, not processes: a job's and its request's


def test_a_job_in_a_relaying_thread_stops_at_its_hard_limit(
    voices: None, upstream: Upstream, settings: Any
) -> None:
    """No alarm reaches a thread: the engine's cancel check ends the job at its limit, as ``timeout``."""
    settings.TTS_MAX_JOB_SECONDS = 2  # this process submits: the row's hard limit is 2 s + 1 s of grace
    settings.TTS_JOB_HARD_GRACE_SECONDS = 1
    upstream.control(hang=True)  # answers its headers, then nothing (its read timeout is 30 s)
    started = time.monotonic()
    job = submit(make_org("streams-limit"), SENTENCE, voice=VOICE, lane="interactive")
    (row,) = wait_status([job.id], timeout=30)
    took = time.monotonic() - started
    assert (row.status, row.error_code) == ("failed", "timeout"), row.error_message
    assert "hard time limit of 3 s" in row.error_message
    assert took < 10  # its limit, not the upstream's 30 s read timeout
    request = upstream.stats()["requests"][-1]
    assert request["client_closed"]  # the upstream request was closed, not left hanging
