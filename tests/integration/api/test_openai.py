"""POST /v1/audio/speech with the official `openai` client, through Nginx and gunicorn."""

from __future__ import annotations

import io
import struct
import threading
import time
from typing import Any, cast

import httpx2
import openai
import pytest
import requests
import soundfile

from tests.integration.api.conftest import base_url


def _client(web: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base_url(web)}/v1",
        api_key=key,
        http_client=httpx2.Client(verify=False, trust_env=False),
        max_retries=0,
        timeout=90,
    )


def test_openai_client_gets_wav_mp3_opus_and_pcm(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    client = _client(web, t.raw_key)
    text = "Hello from the compatible endpoint."
    wav = client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="wav")
    data, rate = soundfile.read(io.BytesIO(wav.content))
    assert 1.0 < len(data) / rate < 6.0
    opus = client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="opus")
    assert opus.content[:4] == b"OggS"
    data, rate = soundfile.read(io.BytesIO(opus.content))
    assert rate == 24000 and 1.0 < len(data) / rate < 6.0
    pcm = client.audio.speech.create(
        model="gpt-4o-mini-tts", voice="en_US-joe-medium", input=text, response_format="pcm", speed=1.5
    )
    samples = len(pcm.content) // 2
    assert len(pcm.content) % 2 == 0 and 0.6 < samples / 24000 < 5.0  # headerless 24 kHz s16le
    assert max(abs(v) for (v,) in struct.iter_unpack("<h", pcm.content[:20000])) > 100  # not silence
    mp3 = client.audio.speech.create(model="tts-1", voice="nova", input=text)  # mp3 is OpenAI's default
    data, rate = soundfile.read(io.BytesIO(mp3.content))
    assert 1.0 < len(data) / rate < 6.0
    jobs = SynthesisJob.objects.filter(organization=t.org)
    assert jobs.count() == 4 and set(jobs.values_list("source", flat=True)) == {"openai"}


def test_openai_errors_have_openai_shape(live_tenant: Any, web: Any) -> None:
    t = live_tenant()
    client = _client(web, t.raw_key)
    with pytest.raises(openai.BadRequestError) as bad_voice:
        client.audio.speech.create(model="tts-1", voice="no-such-voice", input="Hi.")
    err = cast("dict[str, Any]", bad_voice.value.body)  # the JSON error object
    assert (
        err["code"] == "unknown_voice" and err["param"] == "voice" and err["type"] == "invalid_request_error"
    )
    with pytest.raises(openai.BadRequestError) as empty:
        client.audio.speech.create(model="tts-1", voice="alloy", input="   ")
    assert cast("dict[str, Any]", empty.value.body)["param"] == "input"
    with pytest.raises(openai.AuthenticationError) as unauth:
        _client(web, "tts_AAAAAAAA_" + "x" * 40).audio.speech.create(
            model="tts-1", voice="alloy", input="Hi."
        )
    assert (
        unauth.value.status_code == 401
        and cast("dict[str, Any]", unauth.value.body)["code"] == "invalid_api_key"
    )
    # Unknown fields are ignored on /v1 (newer OpenAI clients send more).
    r = requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": "Fine.", "response_format": "wav", "future": 1},
        headers={"Authorization": f"Bearer {t.raw_key}"},
        verify=False,
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["Content-Type"] == "audio/wav"


def test_timeout_cancels_releases_and_answers_504(live_tenant: Any, web: Any, settings: Any) -> None:
    """Runs in-process (the Django client) so the wait can be shortened for this test alone."""
    from django.test import Client

    from webapp.speech.models import SynthesisJob, UsagePeriod

    settings.TTS_OPENAI_WAIT_SECONDS = 0
    t = live_tenant()
    response = Client().post(
        "/v1/audio/speech",
        {"model": "tts-1", "voice": "alloy", "input": "This will not be waited for."},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {t.raw_key}",
    )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"
    assert response["x-should-retry"] == "false"  # OpenAI's clients would retry it as long again
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.cancel_requested or job.status == "canceled"
    row = UsagePeriod.objects.get(organization=t.org)
    assert row.characters_reserved == 0 and row.characters_used == 0


def test_eight_waiting_requests_do_not_block_the_site(live_tenant: Any, web: Any) -> None:
    t = live_tenant(max_concurrent_jobs=20)
    url = base_url(web)
    results: list[int] = []
    # Long enough that the worker's two children are still busy when the site is probed, even
    # with Piper warm from earlier tests (three repeats were all done in time after the streaming tests).
    text = "A sentence long enough to keep the single worker busy for a little while, " * 8

    def call() -> None:
        r = requests.post(
            f"{url}/v1/audio/speech",
            # Uncached: eight jobs of one text would otherwise be served from the first one's sentences.
            json={
                "model": "tts-1",
                "voice": "alloy",
                "input": text,
                "response_format": "wav",
                "cache": False,
            },
            headers={"Authorization": f"Bearer {t.raw_key}"},
            verify=False,
            timeout=120,
        )
        results.append(r.status_code)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for th in threads:
        th.start()
        time.sleep(0.45)  # stay inside Nginx's per-IP POST rate (2 r/s, burst 5)
    time.sleep(0.5)  # all eight are now waiting in gunicorn threads
    session = requests.Session()
    session.trust_env = False
    for path, auth in (("/healthz", False), ("/api/v1/voices", True), ("/api/v1/usage", True)):
        headers = {"Authorization": f"Bearer {t.raw_key}"} if auth else {}
        started = time.monotonic()
        r = session.get(f"{url}{path}", headers=headers, verify=False, timeout=10)
        assert r.status_code == 200, (path, r.text)
        assert time.monotonic() - started < 2.0, path
    assert len(results) < 8, "the requests finished too early to prove anything"
    for th in threads:
        th.join(150)
    assert results == [200] * 8
