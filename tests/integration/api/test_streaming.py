"""Streaming audio while it is made: /v1/audio/speech (the official client) and /api/v1/speech/{id}/stream.

Through Nginx (TLS) and the app server, with a real worker: the stream must
equal the stored file, end broken when its worker dies, and a client that
leaves must cancel its job and pay only for what it heard.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from typing import Any

import httpx2
import openai
import pytest
import requests

from tests.integration.api.conftest import base_url

# Sentences of similar length, so a stream is still going after the first few.
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a text that keeps the worker busy." for n in range(1, 25)
)


def _client(web: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base_url(web)}/v1",
        api_key=key,
        http_client=httpx2.Client(verify=False, trust_env=False),
        max_retries=0,
        timeout=120,
    )


def _stored(job: Any) -> bytes:
    from webapp.speech.services.files import media_path

    job.refresh_from_db()
    with open(media_path(job.audio_path), "rb") as f:
        return f.read()


def test_openai_streaming_response_equals_the_stored_file(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    client = _client(web, t.raw_key)
    text = "The first sentence arrives early. The second one follows it. And a third one ends the stream."
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text, response_format="wav"
    ) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        wav = b"".join(response.iter_bytes())
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.status == "succeeded"
    stored = _stored(job)
    # Streamed live (the job was still running): the streaming header, then the stored file's samples.
    assert wav[:4] == b"RIFF" and wav[4:8] == wav[40:44] == b"\xff\xff\xff\xff"
    assert wav[44:] == stored[44:] and len(stored) > 44 + 20000

    pcm = client.audio.speech.create(
        model="tts-1", voice="alloy", input=text, response_format="pcm", extra_body={"stream_format": "audio"}
    ).content
    pcm_job = SynthesisJob.objects.filter(organization=t.org, format="pcm").get()
    assert pcm == _stored(pcm_job)


def test_mp3_opus_and_aac_stream_as_audio_of_the_same_length(live_tenant: Any, web: Any) -> None:
    import io

    import av

    t = live_tenant()
    client = _client(web, t.raw_key)
    text = "Compressed formats are encoded while the audio arrives. This is the second sentence."
    for fmt in ("mp3", "opus", "aac"):
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format=fmt
        ) as response:
            body = b"".join(response.iter_bytes())
        with av.open(io.BytesIO(body), mode="r") as container:
            samples = sum(frame.samples for frame in container.decode(audio=0))
            rate = container.streams.audio[0].rate
        assert 2.0 < samples / rate < 12.0, fmt


def test_native_stream_of_a_running_and_a_finished_job(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    url = base_url(web)
    headers = {"Authorization": f"Bearer {t.raw_key}"}
    r = requests.post(
        f"{url}/api/v1/speech",
        json={"text": LONG_TEXT[:400], "voice": "en_US-joe-medium", "format": "pcm"},
        headers=headers,
        verify=False,
        timeout=30,
    )
    assert r.status_code in (201, 202), r.text
    job_id = r.json()["id"]
    live = requests.get(f"{url}/api/v1/speech/{job_id}/stream", headers=headers, verify=False, timeout=120)
    assert live.status_code == 200 and live.headers["Content-Type"] == "audio/pcm"
    job = SynthesisJob.objects.get(pk=job_id)
    assert live.content == _stored(job)
    again = requests.get(f"{url}/api/v1/speech/{job_id}/stream", headers=headers, verify=False, timeout=60)
    assert again.content == live.content


def _read_some(response: Any, at_least: int) -> int:
    got = 0
    for chunk in response.iter_content(chunk_size=None):
        got += len(chunk)
        if got >= at_least:
            break
    return got


def test_client_that_leaves_cancels_its_job_and_pays_for_what_it_heard(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod

    t = live_tenant()
    response = requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "pcm"},
        headers={"Authorization": f"Bearer {t.raw_key}", "X-Stainless-Raw-Response": "stream"},
        verify=False,
        stream=True,
        timeout=60,
    )
    assert response.status_code == 200
    _read_some(response, 22050 * 2 * 3)  # about three sentences
    response.close()
    job = SynthesisJob.objects.get(organization=t.org)
    deadline = time.monotonic() + 60
    while not job.is_finished and time.monotonic() < deadline:
        time.sleep(0.3)
        job.refresh_from_db()
    assert job.status == "canceled"
    charge = UsageEvent.objects.get(job_key=job.id, kind="charge")
    assert 0 < charge.characters < job.text_chars
    row = UsagePeriod.objects.get(organization=t.org)
    assert row.characters_reserved == 0 and row.characters_used == charge.characters


def _stream_pcm(web: Any, key: str, text: str) -> requests.Response:
    """/v1/audio/speech streamed as the official client asks for it, the body left to read."""
    return requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"},
        headers={"Authorization": f"Bearer {key}", "X-Stainless-Raw-Response": "stream"},
        verify=False,
        stream=True,
        timeout=90,
    )


def test_worker_killed_mid_stream_ends_the_response_broken(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    response = _stream_pcm(web, t.raw_key, LONG_TEXT)
    assert response.status_code == 200
    chunks = response.iter_content(chunk_size=None)
    first = next(chunks)
    job = SynthesisJob.objects.get(organization=t.org)
    pid = int(str(job.worker).rsplit(":", 1)[1])
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for chunk in chunks:
            first += chunk
    # What did arrive is one attempt's audio: whole 16-bit samples, not silence.
    assert len(first) % 2 == 0 and max(abs(v) for (v,) in struct.iter_unpack("<h", first[:20000])) > 100


def test_first_bytes_of_a_multi_sentence_text_arrive_before_its_job_finishes(
    live_tenant: Any, web: Any
) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    started = time.monotonic()
    response = _stream_pcm(web, t.raw_key, LONG_TEXT[:500])
    assert response.status_code == 200
    chunks = response.iter_content(chunk_size=None)
    body = next(chunks)
    first_byte = time.monotonic() - started
    assert SynthesisJob.objects.get(organization=t.org).status == "running"  # still synthesising
    body += b"".join(chunks)
    whole = time.monotonic() - started
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.status == "succeeded" and body == _stored(job)
    assert first_byte < whole / 2, (first_byte, whole)  # about 8 sentences: the first is a small part
