"""A remote model (synth/engines/remote.py) behind a real worker, its upstream the fake vLLM-Omni server
(tests/upstream/server.py) in two replicas (issue 57, first part): a job streams and completes, the
upstream's failures end it with their codes, a killed replica hands the rest of the job to the other
and nothing is charged twice, a full upstream makes the job wait instead of failing."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.remote.conftest import stream_through_nginx
from tests.reliability.helpers import make_org, start_worker, submit, usage_events, wait_status, wait_until
from tests.stack import TestStack
from tests.upstream.harness import Upstream

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "cosyvoice3"
VOICE = f"{MODEL}:alloy"
TEXT = "The first sentence is here. Then a second one follows. And this is the third."
LONG = " ".join(f"Sentence number {i} of the long remote job." for i in range(1, 13))
DEFAULTS = {
    "parts_per_sentence": 1,
    "fail_5xx": False,
    "hang": False,
    "wrong_content_type": False,
    "capacity": None,
    "chunk_delay_ms": 0,
}


@pytest.fixture(scope="module")
def remote_models(upstreams: list[Upstream], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The remote models file naming the two replicas; this process reads it too (voices, capabilities)."""
    path = tmp_path_factory.mktemp("remote") / "remote-models.json"
    model = {
        "upstreams": [u.url for u in upstreams],
        "voices": [{"id": "alloy", "language": "en-us", "name": "Alloy"}],
        "read_timeout_seconds": 2,
        "streams_per_upstream": 2,
    }
    path.write_text(json.dumps({"models": {MODEL: model}}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TTS_REMOTE_MODELS_FILE", str(path))
        yield path


@pytest.fixture(scope="module")
def worker(stack: TestStack, remote_models: Path) -> Iterator[Any]:
    service = start_worker(stack, "remote", engines=MODEL, TTS_REMOTE_MODELS_FILE=str(remote_models))
    try:
        yield service
    finally:
        stack.stop_service(service)


@pytest.fixture
def remote_voices(db: None, worker: Any, upstreams: list[Upstream]) -> None:
    """The model's voices as rows (a flush between transactional tests removes what the worker
    announced), and the replicas' switches back to normal."""
    from synth.registry import list_voices
    from webapp.speech.voices import sync_builtin_voices

    sync_builtin_voices(list_voices(engines=[MODEL]))
    for upstream in upstreams:
        if upstream.process.poll() is None:
            upstream.control(**DEFAULTS)


def speech_requests(upstream: Upstream) -> list[dict[str, Any]]:
    return [
        r for r in upstream.stats()["requests"] if r.get("path", "/v1/audio/speech") == "/v1/audio/speech"
    ]


def going(record: dict[str, Any]) -> bool:
    """An upstream request still being answered (neither finished nor left by its client)."""
    return not record["finished"] and not record["client_closed"]


def test_a_job_on_a_remote_model_is_spoken_upstream_sentence_by_sentence(
    remote_voices: None, upstreams: list[Upstream]
) -> None:
    from webapp.speech.models import SynthesisJob

    before = sum(len(speech_requests(u)) for u in upstreams)
    job = submit(make_org("remote-ok"), TEXT, voice=VOICE)
    (row,) = wait_status([job.id], timeout=60)
    assert row.status == "succeeded", (row.error_code, row.error_message)
    assert row.metrics["audio_seconds"] > 2.0  # three sentences of speech, not silence or a stub
    sent = [r for u in upstreams for r in speech_requests(u)]
    assert len(sent) - before == 3  # one request per sentence
    body = sent[-1]["body"]
    assert (body["model"], body["voice"], body["response_format"], body["stream"]) == (
        MODEL,
        "alloy",
        "pcm",
        True,
    )
    assert SynthesisJob.objects.get(pk=job.id).engine == MODEL


def test_a_client_streams_a_remote_job_through_nginx_as_its_upstream_speaks(
    remote_voices: None, upstreams: list[Upstream], web: Any
) -> None:

    from webapp.speech.models import SynthesisJob
    from webapp.tenants.services import OPERATOR, create_api_key

    org = make_org("remote-stream")
    _, key = create_api_key(org, "stream", created_by=OPERATOR, scopes=["speech:read", "speech:write"])
    for upstream in upstreams:
        upstream.control(chunk_delay_ms=800)  # each sentence takes 0.8 s upstream
    body = {"model": MODEL, "voice": VOICE, "input": TEXT, "response_format": "pcm", "stream_format": "audio"}
    first, whole, audio = stream_through_nginx(web, key, body)
    assert first < whole - 1.2  # the first sentence's audio came while the others were spoken upstream
    assert len(audio) / 2 / 24000 > 2.0  # three sentences of speech at the model's 24 kHz
    (job,) = SynthesisJob.objects.filter(organization=org)
    assert (job.status, job.engine) == ("succeeded", MODEL)


def test_a_sentence_is_relayed_part_by_part_as_its_upstream_streams_it(
    remote_voices: None, upstreams: list[Upstream], web: Any
) -> None:
    """A model that streams a sentence as it generates it: its first part reaches the client long
    before the sentence's last, and parts cut inside samples are joined without losing one."""

    from webapp.tenants.services import OPERATOR, create_api_key

    org = make_org("remote-parts")
    _, key = create_api_key(org, "parts", created_by=OPERATOR, scopes=["speech:read", "speech:write"])
    for upstream in upstreams:
        upstream.control(parts_per_sentence=5, chunk_delay_ms=400)  # 2 s for the one sentence
    sentence = "One sentence only, which its upstream streams in five parts as it makes them."
    body = {
        "model": MODEL,
        "voice": VOICE,
        "input": sentence,
        "response_format": "pcm",
        "stream_format": "audio",
    }
    first, whole, audio = stream_through_nginx(web, key, body)
    assert first < whole - 1.2  # heard after its first part, not its fifth
    (sent,) = [r for u in upstreams for r in speech_requests(u) if r["body"]["input"] == sentence]
    assert sent["chunks_sent"] == 5 and len(audio) == sent["bytes_sent"]  # every sample, once


def test_the_operations_page_shows_each_upstream_as_the_worker_used_it(
    remote_voices: None, upstreams: list[Upstream], admin_client: Any
) -> None:
    job = submit(make_org("remote-ops"), TEXT, voice=VOICE)
    assert wait_status([job.id], timeout=60)[0].status == "succeeded"

    def shown() -> list[dict[str, Any]] | None:
        # A heartbeat from after the job: one sent while it ran shows its request in flight.
        rows = admin_client.get("/admin/speech/operations/data.json").json()["upstreams"]
        used = [r for r in rows if r["model"] == MODEL and r["requests"] >= 3 and r["in_flight"] == 0]
        return rows if used else None

    rows = wait_until(shown, 10, "the worker's heartbeat with the upstreams it used, none in flight")
    assert {r["url"] for r in rows} == {u.url for u in upstreams}
    used = next(r for r in rows if r["requests"] >= 3)
    assert used["down"] is False and used["failures"] == 0
    # Measured from the request's start: a local fake may answer within a millisecond.
    assert used["first_audio_ms"] is not None and 0 <= used["first_audio_ms"] < 5000
    page = admin_client.get("/admin/speech/operations/").content.decode()
    assert 'id="ops-upstreams"' in page and upstreams[0].url in page


@pytest.mark.parametrize(
    ("switch", "code"),
    [
        ("fail_5xx", "upstream_failed"),
        ("wrong_content_type", "upstream_failed"),
        ("hang", "upstream_timeout"),
    ],
)
def test_an_upstream_failure_ends_the_job_with_its_code(
    remote_voices: None, upstreams: list[Upstream], switch: str, code: str
) -> None:
    for upstream in upstreams:
        upstream.control(**{switch: True})
    started = time.monotonic()
    job = submit(make_org(f"remote-{switch}"), TEXT, voice=VOICE)
    (row,) = wait_status([job.id], timeout=60)
    assert (row.status, row.error_code) == ("failed", code), row.error_message
    assert time.monotonic() - started < 30  # the hang ends at the model's read timeout (2 s), not the job's
    assert "charge" not in usage_events(job.id)


def test_a_cancel_closes_the_upstream_request_in_flight(
    remote_voices: None, upstreams: list[Upstream]
) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    for upstream in upstreams:
        upstream.control(chunk_delay_ms=5000)  # the first sentence's audio is five seconds away
    job = submit(make_org("remote-cancel"), TEXT, voice=VOICE)

    def in_flight() -> dict[str, Any] | None:
        return next((r for u in upstreams for r in speech_requests(u) if going(r)), None)

    request = wait_until(in_flight, 30, "the first sentence's request upstream")
    started = time.monotonic()
    lifecycle.cancel_job(SynthesisJob.objects.get(pk=job.id))
    (row,) = wait_status([job.id], statuses=("canceled",), timeout=10)
    assert row.status == "canceled" and time.monotonic() - started < 4  # not after the 5 s sentence
    closed = wait_until(
        lambda: next(
            (
                r
                for u in upstreams
                for r in speech_requests(u)
                if r["id"] == request["id"] and r["client_closed"]
            ),
            None,
        ),
        10,
        "the upstream to see its client go",
    )
    assert closed["bytes_sent"] == 0 and not closed["finished"]  # closed before its audio, not answered
    assert "charge" not in usage_events(job.id)


def test_a_full_upstream_makes_the_job_wait_not_fail(remote_voices: None, upstreams: list[Upstream]) -> None:
    for upstream in upstreams:
        upstream.control(capacity=0)  # every speech request refused with 503, as a full server
    job = submit(make_org("remote-full"), TEXT, voice=VOICE)
    wait_until(lambda: any(r["status"] == 503 for u in upstreams for r in speech_requests(u)), 30, "a 503")
    time.sleep(2)
    assert wait_status([job.id], statuses=("running",), timeout=5)[0].status == "running"
    for upstream in upstreams:
        upstream.control(capacity=None)
    (row,) = wait_status([job.id], timeout=60)
    assert row.status == "succeeded", (row.error_code, row.error_message)


def test_a_killed_replica_hands_the_rest_of_the_job_to_the_other_and_charges_once(
    remote_voices: None, upstreams: list[Upstream]
) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent

    for upstream in upstreams:
        upstream.control(chunk_delay_ms=300)  # a sentence takes a while: the kill lands mid-job
    job = submit(make_org("remote-kill"), LONG, voice=VOICE)
    wait_until(lambda: SynthesisJob.objects.get(pk=job.id).progress >= 0.2, 60, "the job mid-way")
    first = next(u for u in upstreams if any(going(r) for r in speech_requests(u)))
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait(10)
    (row,) = wait_status([job.id], timeout=90)
    assert row.status == "succeeded", (row.error_code, row.error_message)
    assert row.attempts == 1  # the engine moved the sentences on; the job was not retried
    other = next(u for u in upstreams if u is not first)
    assert speech_requests(other)
    charges = UsageEvent.objects.filter(job_key=job.id, kind=UsageEvent.Kind.CHARGE)
    assert [c.characters for c in charges] == [len(LONG)]
