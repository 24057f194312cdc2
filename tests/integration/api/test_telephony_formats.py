"""The formats voice agents use: 8 kHz G.711 (``ulaw``, ``alaw``) and PCM at a chosen rate, through
Nginx and gunicorn with a real worker: /v1/audio/speech whole and streamed, a refused
``sample_rate``, and a realtime session in μ-law."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import requests

from synth import g711
from tests.integration.api.conftest import base_url
from tests.integration.api.session_client import Received, closed, open_session, read_until, send
from tests.reliability.helpers import PIPER

TEXT = "Thank you for calling. Your table is booked for eight."


def speech(web: Any, key: str, body: dict[str, Any], stream: bool = False) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if stream:
        headers["X-Stainless-Raw-Response"] = "stream"  # as the official client's streaming response
    return requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": TEXT, **body},
        headers=headers,
        verify=False,
        timeout=90,
    )


def finished_job(org: Any, fmt: str) -> Any:
    from webapp.speech.models import SynthesisJob

    job = SynthesisJob.objects.filter(organization=org, format=fmt).latest("created_at")
    assert job.status == "succeeded" and job.duration_seconds
    return job


def stored(job: Any) -> bytes:
    from webapp.speech.services.files import media_path

    with open(media_path(job.audio_path), "rb") as f:
        return f.read()


def audible(samples: np.ndarray) -> bool:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) > 300  # int16 RMS, not silence


@pytest.mark.parametrize(("fmt", "content_type"), [("ulaw", "audio/basic"), ("alaw", "audio/x-alaw-basic")])
def test_g711_on_the_openai_endpoint_is_raw_8_khz(
    live_tenant: Any, web: Any, fmt: str, content_type: str
) -> None:
    t = live_tenant()
    r = speech(web, t.raw_key, {"response_format": fmt})
    assert r.status_code == 200 and r.headers["Content-Type"] == content_type, r.text
    job = finished_job(t.org, fmt)
    assert job.sample_rate in (None, 8000)
    # One byte a sample at 8 kHz, no header: the length is the duration.
    assert len(r.content) == round(job.duration_seconds * 8000) and r.content == stored(job)
    assert audible(g711.decode(r.content, fmt))
    # Streamed while it is made, the bytes are the stored file's: both are companded from the same samples.
    live = speech(web, t.raw_key, {"response_format": fmt, "cache": False}, stream=True)
    assert live.status_code == 200 and live.headers["Content-Type"] == content_type
    assert live.headers.get("Transfer-Encoding") == "chunked"
    assert live.content == stored(finished_job(t.org, fmt))


def test_pcm_at_a_chosen_rate_and_refused_rates(live_tenant: Any, web: Any) -> None:
    t = live_tenant()
    r = speech(web, t.raw_key, {"response_format": "pcm", "sample_rate": 16000})
    assert r.status_code == 200 and r.headers["Content-Type"] == "audio/pcm", r.text
    job = finished_job(t.org, "pcm")
    assert job.sample_rate == 16000
    assert len(r.content) == 2 * round(job.duration_seconds * 16000) and audible(
        np.frombuffer(r.content, "<i2")
    )

    refused = [
        ({"response_format": "ulaw", "sample_rate": 16000}, "8000"),
        ({"response_format": "opus", "sample_rate": 22050}, "8000, 12000, 16000, 24000, 48000"),
        ({"response_format": "pcm", "sample_rate": 12345}, "22050"),
    ]
    for body, allowed in refused:
        bad = speech(web, t.raw_key, body)
        assert bad.status_code == 400, (body, bad.text)
        error = bad.json()["error"]  # OpenAI's shape, naming the field and what it may be
        assert error["param"] == "sample_rate" and error["code"] == "unsupported_sample_rate", error
        assert (
            f"response_format {body['response_format']}" in error["message"] and allowed in error["message"]
        )
    for value in ("16000", 16000.5, True, 0):
        bad = speech(web, t.raw_key, {"response_format": "pcm", "sample_rate": value})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "sample_rate", (value, bad.text)


def test_a_realtime_session_in_ulaw(live_tenant: Any, web: Any) -> None:
    t = live_tenant()
    with open_session(int(web.cfg.https_port), t.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": PIPER, "response_format": "ulaw"})
        got = read_until(ws, Received(), lambda g: g.of("session.ready"))
        # A later config that asks ulaw for a rate it cannot carry is refused, naming the one it can.
        send(ws, {"type": "session.config", "voice": PIPER, "response_format": "ulaw", "sample_rate": 16000})
        got = read_until(ws, got, lambda g: g.of("error"))
        send(ws, {"type": "input.text", "text": TEXT, "flush": True})
        got = read_until(ws, got, lambda g: g.of("session.done"))
        send(ws, {"type": "session.close"})
        read_until(ws, got, closed)
    (refused,) = got.of("error")
    assert refused["param"] == "sample_rate" and "use one of 8000" in refused["message"], refused
    (ready,) = got.of("session.ready")
    assert ready["format"] == "ulaw" and ready["sample_rate"] == 8000
    starts, dones = got.of("audio.start"), got.of("audio.done")
    assert starts and all(s["format"] == "ulaw" and s["sample_rate"] == 8000 for s in starts)
    assert sum(d["total_bytes"] for d in dones) == len(got.audio) and got.close_code == 1000
    (closed_event,) = got.of("session.closed")
    # A byte a sample: the bytes sent are the session's seconds of audio at 8 kHz.
    assert math.isclose(len(got.audio), closed_event["audio_seconds"] * 8000, rel_tol=0.01, abs_tol=10)
    assert audible(g711.decode(got.audio, "ulaw"))


def test_native_api_stream_download_and_sse_in_g711(live_tenant: Any, web: Any) -> None:
    import base64
    import json

    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    url, headers = base_url(web), {"Authorization": f"Bearer {t.raw_key}"}
    r = requests.post(
        f"{url}/api/v1/speech",
        json={"text": TEXT, "voice": PIPER, "format": "alaw", "sample_rate": 8000},
        headers=headers,
        verify=False,
        timeout=30,
    )
    assert r.status_code in (201, 202), r.text
    job_id = r.json()["id"]
    live = requests.get(f"{url}/api/v1/speech/{job_id}/stream", headers=headers, verify=False, timeout=90)
    assert live.status_code == 200 and live.headers["Content-Type"] == "audio/x-alaw-basic"
    job = SynthesisJob.objects.get(pk=job_id)
    assert job.status == "succeeded" and live.content == stored(job)
    download = requests.get(f"{url}/api/v1/speech/{job_id}/audio", headers=headers, verify=False, timeout=30)
    assert download.status_code == 200 and download.headers["Content-Type"] == "audio/x-alaw-basic"
    assert download.headers["Content-Disposition"].endswith(f'filename="{job_id}.alaw"')
    assert download.content == live.content
    listed = requests.get(f"{url}/api/v1/speech/{job_id}", headers=headers, verify=False, timeout=30).json()
    assert listed["format"] == "alaw"

    # OpenAI's server-sent events: the deltas' bytes joined are the stored μ-law file.
    sse = speech(
        web, t.raw_key, {"response_format": "ulaw", "stream_format": "sse", "cache": False}, stream=True
    )
    assert sse.status_code == 200 and sse.headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert events[-1]["type"] == "speech.audio.done"
    assert audio == stored(finished_job(t.org, "ulaw")) and audible(g711.decode(audio, "ulaw"))
