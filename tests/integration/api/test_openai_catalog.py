"""GET /v1/models and GET /v1/audio/voices: what OpenAI's clients and tools list."""

from __future__ import annotations

from typing import Any

import pytest


def test_models_lists_the_speech_models_in_openai_shape(make_tenant: Any) -> None:
    t = make_tenant()
    body = t.client.get("/v1/models").json()
    assert body["object"] == "list"
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= {m["id"] for m in body["data"]}
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in body["data"])


def test_voices_show_the_openai_names_mapped_to_each(make_tenant: Any, builtin_voices: list[str]) -> None:
    t = make_tenant()
    body = t.client.get("/v1/audio/voices").json()
    by_id = {v["id"]: v for v in body["data"]}
    assert set(builtin_voices) <= set(by_id)
    assert "alloy" in by_id["en_US-joe-medium"]["openai_names"]
    assert body["openai_voice_map"]["alloy"] == "en_US-joe-medium"


def test_catalog_needs_a_key_and_answers_in_openai_error_shape(make_tenant: Any) -> None:
    from django.test import Client

    r = Client().get("/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["code"] in ("invalid_api_key", "not_authenticated")


def test_a_stream_format_other_than_audio_or_sse_is_refused_with_an_openai_error(
    make_tenant: Any, builtin_voices: list[str]
) -> None:
    t = make_tenant()  # ("sse" is served since issue 33: tests/integration/api/test_openai_sse.py)
    r = t.client.post(
        "/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "Hi.", "stream_format": "bogus"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_format"


def test_speed_and_instructions_reach_the_job_as_on_the_native_api(
    live_tenant: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.test import Client

    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import dispatch

    settings.TTS_OPENAI_WAIT_SECONDS = 0  # only the job it submits matters here
    # Nor does its run: a worker still writing the job when the test's tables are
    # truncated deadlocked that teardown once.
    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)
    t = live_tenant()
    Client().post(
        "/v1/audio/speech",
        {
            "model": "tts-1",
            "voice": "alloy",
            "input": "Hi there.",
            "speed": 1.25,
            "instructions": "Speak slowly.",
        },
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {t.raw_key}",
    )
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.params["speed"] == 1.25 and job.params["instructions"] == "Speak slowly."
