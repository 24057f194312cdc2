"""POST /v1/audio/speech with ``stream_format: "sse"`` (issue 33, item 1), through Nginx and gunicorn.

The same stream as the chunked one, framed as OpenAI's server-sent events: the
deltas carry the stored file's audio, the done event's usage is the job's
charge in the ledger, and a client that leaves after its first event pays no
more than the sentences it was handed; mp3, Ogg/Opus and AAC deltas are whole
frames, flac is one delta after the usual wait (504 when it times out). A small
SSE parser reads the events (the official client hands SSE back as raw bytes).
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx2
import openai
import requests
from django.conf import settings

from tests.integration.api.conftest import base_url

TEXT = "The first sentence is short. A second follows it. The third ends here."
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a text that keeps the worker busy." for n in range(1, 25)
)


def sse_events(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON of each event's ``data:`` lines, as a plain SSE client reads them."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if data:
                yield json.loads(b"\n".join(data))
    assert not buffer.strip(), f"an unfinished event at the end: {buffer[:200]!r}"


def _post(web: Any, key: str, body: dict[str, Any], **kwargs: Any) -> requests.Response:
    return requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={"model": "gpt-4o-mini-tts", "voice": "alloy", **body},
        headers={"Authorization": f"Bearer {key}"},
        verify=False,
        timeout=90,
        **kwargs,
    )


def _stored(job: Any) -> bytes:
    from webapp.speech.services.files import media_path

    job.refresh_from_db()
    with open(media_path(job.audio_path), "rb") as f:
        return f.read()


def _charge(job_id: Any) -> int:
    from webapp.speech.models import UsageEvent

    return int(UsageEvent.objects.get(job_key=job_id, kind=UsageEvent.Kind.CHARGE).characters)


def _audio_and_usage(events: list[dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
    """The deltas' audio joined, and the done event's usage (checked to be the last event, once)."""
    assert len(events) >= 2, events
    *deltas, done = events
    assert all(e["type"] == "speech.audio.delta" for e in deltas), [e["type"] for e in events]
    assert done["type"] == "speech.audio.done"
    return b"".join(base64.b64decode(e["audio"]) for e in deltas), done["usage"]


def _check_usage(usage: dict[str, Any], job: Any) -> None:
    charged = _charge(job.id)
    assert charged == job.text_chars  # the whole job was handed: its billable characters
    assert usage == {
        "input_tokens": charged,
        "output_tokens": 0,
        "total_tokens": charged,
        "input_token_details": {"text_tokens": charged, "audio_tokens": 0},  # vLLM-Omni's breakdown
    }


def test_sse_pcm_deltas_are_the_stored_audio_and_done_says_the_charge(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    response = _post(
        web, t.raw_key, {"input": TEXT, "response_format": "pcm", "stream_format": "sse"}, stream=True
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-store"
    events = list(sse_events(response.iter_content(chunk_size=None)))
    audio, usage = _audio_and_usage(events)
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.status == "succeeded" and job.format == "pcm"
    assert audio == _stored(job) and len(audio) > 20000
    _check_usage(usage, job)
    assert job.delivered_chars == job.text_chars  # the stream's marks reach its end, last sentence too


def test_sse_wav_starts_with_its_header_and_holds_the_stored_samples(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    response = _post(
        web, t.raw_key, {"input": TEXT, "response_format": "wav", "stream_format": "sse"}, stream=True
    )
    assert response.status_code == 200, response.text
    events = list(sse_events(response.iter_content(chunk_size=None)))
    audio, usage = _audio_and_usage(events)
    assert base64.b64decode(events[0]["audio"])[:4] == b"RIFF"  # the header is in the first delta
    job = SynthesisJob.objects.get(organization=t.org)
    stored = _stored(job)
    # The same samples (sent live, its header is the streaming one; sent whole, the file's own).
    assert len(audio) == len(stored) and audio[44:] == stored[44:]
    _check_usage(usage, job)


def test_a_client_that_leaves_after_its_first_delta_pays_only_what_it_was_handed(
    live_tenant: Any, web: Any
) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod

    t = live_tenant()
    body = {"input": LONG_TEXT, "response_format": "pcm", "stream_format": "sse"}
    response = _post(web, t.raw_key, body, stream=True)
    assert response.status_code == 200, response.text
    first = next(sse_events(response.iter_content(chunk_size=None)))
    assert first["type"] == "speech.audio.delta" and base64.b64decode(first["audio"])
    response.close()
    job = SynthesisJob.objects.get(organization=t.org)
    settled = UsageEvent.objects.exclude(kind=UsageEvent.Kind.RESERVE).filter(job_key=job.id)
    deadline = time.monotonic() + 60
    while not (settled.exists() and job.is_finished) and time.monotonic() < deadline:
        time.sleep(0.3)
        job.refresh_from_db()
    # Canceled; or, if it succeeded before its client's leaving reached the server, its audio
    # removed (a job settled by its answer: docs/api.md, "What is charged").
    assert job.status in ("canceled", "expired"), job.status
    event = settled.get()
    # The sentences whose events left the web process (and audio past the bound per character,
    # by its seconds: a part of a sentence heard), never the whole text.
    per_char = settings.TTS_AUDIO_SECONDS_PER_CHAR
    bound = job.delivered_chars + math.ceil(job.delivered_seconds / per_char)
    assert event.characters <= bound and job.delivered_chars < job.text_chars, (event.parts, bound)
    row = UsagePeriod.objects.get(organization=t.org)
    assert row.characters_reserved == 0 and row.characters_used == event.characters


def test_a_stream_format_other_than_audio_or_sse_is_400(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    response = _post(web, t.raw_key, {"input": "Hi.", "stream_format": "bogus"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "stream_format"
    assert not SynthesisJob.objects.filter(organization=t.org).exists()


def test_the_official_client_streams_sse_end_to_end(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    client = openai.OpenAI(
        base_url=f"{base_url(web)}/v1",
        api_key=t.raw_key,
        http_client=httpx2.Client(verify=False, trust_env=False),
        max_retries=0,
        timeout=90,
    )
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(response.iter_bytes()))
    audio, usage = _audio_and_usage(events)
    job = SynthesisJob.objects.get(organization=t.org)
    assert audio == _stored(job)
    _check_usage(usage, job)


def test_sse_flac_is_one_delta_of_the_whole_file(live_tenant: Any) -> None:
    """In-process (Django's client): the answer comes once the job succeeded, as a whole flac's does."""
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    body = {"model": "tts-1", "voice": "alloy", "input": "Sent whole.", "response_format": "flac"}
    response = t.client.post("/v1/audio/speech", {**body, "stream_format": "sse"})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-store" and response["X-Accel-Buffering"] == "no"
    events = list(sse_events(response.streaming_content))
    assert len(events) == 2
    audio, usage = _audio_and_usage(events)
    job = SynthesisJob.objects.get(organization=t.org)
    assert audio[:4] == b"fLaC" and audio == _stored(job)
    _check_usage(usage, job)


def test_sse_mp3_opus_and_aac_deltas_decode_and_the_first_plays_alone(live_tenant: Any, web: Any) -> None:
    import io

    import av

    def seconds(data: bytes) -> float:
        with av.open(io.BytesIO(data), mode="r") as container:
            samples = sum(frame.samples for frame in container.decode(audio=0))
            return float(samples / container.streams.audio[0].rate)

    t = live_tenant()
    for fmt in ("mp3", "opus", "aac"):
        response = _post(
            web, t.raw_key, {"input": TEXT, "response_format": fmt, "stream_format": "sse"}, stream=True
        )
        assert response.status_code == 200, (fmt, response.text)
        events = list(sse_events(response.iter_content(chunk_size=None)))
        audio, usage = _audio_and_usage(events)
        assert 2.0 < seconds(audio) < 12.0, fmt
        # Whole frames (Ogg pages, the container's header first): the first delta decodes by itself.
        assert seconds(base64.b64decode(events[0]["audio"])) > 0, fmt
        assert usage["total_tokens"] == len(TEXT)


def test_sse_flac_not_finished_in_time_is_the_usual_504(live_tenant: Any, settings: Any) -> None:
    from django.test import Client

    from webapp.speech.models import SynthesisJob, UsagePeriod

    settings.TTS_OPENAI_WAIT_SECONDS = 0
    t = live_tenant()
    body = {"model": "tts-1", "voice": "alloy", "input": "Not waited for.", "response_format": "flac"}
    response = Client().post(
        "/v1/audio/speech",
        {**body, "stream_format": "sse"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {t.raw_key}",
    )
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    assert response["x-should-retry"] == "false"
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.cancel_requested or job.status == "canceled"
    row = UsagePeriod.objects.get(organization=t.org)
    assert row.characters_reserved == 0 and row.characters_used == 0
