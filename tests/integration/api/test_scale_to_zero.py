"""Voices of a pool that may scale to zero (TTS_SCALE_TO_ZERO_QUEUES): their submits queue while no
worker is live, with the pool's cold start in the ETA; every other queue keeps its 503 no_worker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.api.conftest import problem

PIPER = "en_US-joe-medium"
ESPEAK = "espeak-en-us"


@pytest.fixture
def no_heartbeats(settings: Any, stack: Any) -> Iterator[Any]:
    """A reachable Redis database where no worker beats (database 15 is these tests' own)."""
    from webapp import redis_clients

    settings.REDIS_URL = stack.cfg.redis_url.rsplit("/", 1)[0] + "/15"
    settings.TTS_SCALE_TO_ZERO_QUEUES = ["synth.piper"]
    settings.TTS_POOL_COLD_START_SECONDS = 120.0
    redis_clients.heartbeats().flushdb()
    try:
        yield settings
    finally:
        redis_clients.heartbeats().flushdb()


@pytest.fixture(autouse=True)
def fresh_bases() -> Iterator[None]:
    from webapp.speech.services import eta

    eta.forget_bases()  # a basis saved by another test (with live workers) must not answer here
    yield
    eta.forget_bases()


def test_a_scale_to_zero_voice_queues_with_no_worker_and_its_eta_has_the_cold_start(
    make_tenant: Any, builtin_voices: list[str], no_heartbeats: Any
) -> None:
    from webapp.speech.models import SynthesisJob

    t = make_tenant()
    response = t.client.post("/api/v1/speech", {"text": "Wake the pool.", "voice": PIPER})
    assert response.status_code == 202, response.content
    job = response.json()
    assert job["status"] == "queued" and job["queue_position"] == 0
    assert 120 <= job["eta_seconds"] < 125, job["eta_seconds"]
    assert t.client.get(f"/api/v1/speech/{job['id']}").json()["eta_seconds"] >= 120

    # eSpeak's queue is not declared: no worker there is still a 503, and no job.
    refused = t.client.post("/api/v1/speech", {"text": "Anyone there?", "voice": ESPEAK})
    assert refused.status_code == 503 and problem(refused)["code"] == "no_worker"
    assert SynthesisJob.objects.filter(organization=t.org).count() == 1


def test_a_live_worker_of_the_engine_without_the_voice_is_still_503(
    make_tenant: Any, builtin_voices: list[str], no_heartbeats: Any
) -> None:
    from webapp.speech import heartbeat

    # The pool is up (not at zero) and does not serve this voice: waiting would not bring it.
    beat = {"worker_id": "pool:1", "state": "ready", "engines": ["piper"], "voices": ["another-voice"]}
    heartbeat.publish("pool:1", beat, ttl=30)
    t = make_tenant()
    response = t.client.post("/api/v1/speech", {"text": "Not this one.", "voice": PIPER})
    assert response.status_code == 503 and problem(response)["code"] == "no_worker"
    # A pool that is only loading counts as at zero: its model is coming, the job queues.
    heartbeat.publish("pool:1", {**beat, "state": "loading"}, ttl=30)
    assert t.client.post("/api/v1/speech", {"text": "Coming up.", "voice": PIPER}).status_code == 202


def test_without_the_setting_no_worker_is_503_as_before(
    make_tenant: Any, builtin_voices: list[str], no_heartbeats: Any
) -> None:
    no_heartbeats.TTS_SCALE_TO_ZERO_QUEUES = []
    t = make_tenant()
    response = t.client.post("/api/v1/speech", {"text": "Anyone there?", "voice": PIPER})
    assert response.status_code == 503 and problem(response)["code"] == "no_worker"


def test_the_openai_endpoint_queues_too(
    transactional_db: None, make_tenant: Any, builtin_voices: list[str], no_heartbeats: Any
) -> None:
    """It waits for the job (0 s here): a 504 timeout, not a 503 no_worker, so the job was queued."""
    from django.test import Client

    from webapp.speech.models import SynthesisJob

    no_heartbeats.TTS_OPENAI_WAIT_SECONDS = 0
    t = make_tenant()
    response = Client().post(
        "/v1/audio/speech",
        {"model": "tts-1", "voice": "alloy", "input": "Wake the pool."},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {t.raw_key}",
    )
    assert response.status_code == 504, response.content
    assert response.json()["error"]["code"] == "timeout"
    assert SynthesisJob.objects.filter(organization=t.org, engine="piper").count() == 1


def test_a_name_that_is_no_engine_queue_is_a_start_up_error(tmp_path: Any) -> None:
    env = {**os.environ, "TTS_VAR_DIR": str(tmp_path), "TTS_SCALE_TO_ZERO_QUEUES": "synth.chatterbox,piper"}
    done = subprocess.run(
        [sys.executable, "-c", "import webapp.settings"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "TTS_SCALE_TO_ZERO_QUEUES: piper is not an engine queue like synth.piper" in done.stderr
