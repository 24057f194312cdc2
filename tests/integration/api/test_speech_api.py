"""The job lifecycle through the API: submit, poll, list, cancel, delete."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import problem

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")


def test_voices_lists_builtin_voices(make_tenant: Any) -> None:
    t = make_tenant()
    response = t.client.get("/api/v1/voices")
    assert response.status_code == 200
    ids = {v["id"] for v in response.json()["results"]}
    assert "en_US-joe-medium" in ids
    assert any(i.startswith("espeak-") for i in ids)
    one = t.client.get("/api/v1/voices/en_US-joe-medium").json()
    assert one["builtin"] is True and one["engine"] == "piper"
    assert "formats" in one["capabilities"]


def test_submit_returns_202_with_job_and_location(make_tenant: Any) -> None:
    t = make_tenant()
    response = t.client.post("/api/v1/speech", {"text": "Hello there.", "voice": "en_US-joe-medium"})
    assert response.status_code == 202, response.content
    job = response.json()
    assert response["Location"] == f"/api/v1/speech/{job['id']}"
    assert set(job) == {
        "id",
        "status",
        "text_chars",
        "voice",
        "format",
        "lane",
        "progress",
        "queue_position",
        "eta_seconds",
        "created_at",
        "started_at",
        "finished_at",
        "expires_at",
        "audio_url",
        "duration_seconds",
        "metrics",
        "error",
        "pronunciation_dictionaries",
        "cached_characters",
    }
    assert job["status"] == "queued" and job["text_chars"] == 12 and job["format"] == "wav"
    assert job["queue_position"] is not None and job["eta_seconds"] > 0
    assert job["audio_url"] is None and job["error"] is None
    got = t.client.get(f"/api/v1/speech/{job['id']}")
    assert got.status_code == 200 and got.json()["id"] == job["id"]
    audio = t.client.get(f"/api/v1/speech/{job['id']}/audio")
    assert audio.status_code == 409
    assert problem(audio)["code"] == "audio_not_ready"


def test_cancel_queued_job_releases_and_delete_removes(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsagePeriod

    t = make_tenant()
    job = t.client.post("/api/v1/speech", {"text": "Cancel me."}).json()
    canceled = t.client.post(f"/api/v1/speech/{job['id']}/cancel")
    assert canceled.status_code == 200 and canceled.json()["status"] == "canceled"
    row = UsagePeriod.objects.get(organization=t.org)
    assert (row.characters_reserved, row.characters_used) == (0, 0)
    again = t.client.post(f"/api/v1/speech/{job['id']}/cancel")
    assert again.status_code == 200  # canceling a canceled job is idempotent
    assert t.client.delete(f"/api/v1/speech/{job['id']}").status_code == 204
    assert not SynthesisJob.objects.filter(id=job["id"]).exists()
    assert t.client.get(f"/api/v1/speech/{job['id']}").status_code == 404


def test_history_is_newest_first_with_cursor_and_status_filter(make_tenant: Any) -> None:
    t = make_tenant()
    ids = [t.client.post("/api/v1/speech", {"text": f"Job number {i}."}).json()["id"] for i in range(5)]
    t.client.post(f"/api/v1/speech/{ids[0]}/cancel")
    first = t.client.get("/api/v1/speech", {"limit": "2"}).json()
    assert [j["id"] for j in first["results"]] == [ids[4], ids[3]]
    second = t.client.get(first["next"]).json()
    assert [j["id"] for j in second["results"]] == [ids[2], ids[1]]
    third = t.client.get(second["next"]).json()
    assert [j["id"] for j in third["results"]] == [ids[0]] and third["next"] is None
    canceled = t.client.get("/api/v1/speech", {"status": "canceled"}).json()["results"]
    assert [j["id"] for j in canceled] == [ids[0]]
    bad = t.client.get("/api/v1/speech", {"status": "bogus"})
    assert bad.status_code == 400 and problem(bad)["field"] == "status"
    assert t.client.get("/api/v1/speech", {"cursor": "!!!"}).status_code == 400
    assert t.client.get("/api/v1/speech", {"limit": "0"}).status_code == 400


def test_long_poll_returns_at_once_for_finished_and_waits_capped(make_tenant: Any, settings: Any) -> None:
    import time

    settings.TTS_LONG_POLL_MAX_SECONDS = 1
    t = make_tenant()
    job = t.client.post("/api/v1/speech", {"text": "Wait for me."}).json()
    started = time.monotonic()
    body = t.client.get(f"/api/v1/speech/{job['id']}", {"wait": "30"}).json()
    elapsed = time.monotonic() - started
    assert body["status"] == "queued"  # never dispatched inside this test transaction
    assert 0.9 <= elapsed < 3, elapsed
    t.client.post(f"/api/v1/speech/{job['id']}/cancel")
    started = time.monotonic()
    assert t.client.get(f"/api/v1/speech/{job['id']}", {"wait": "30"}).json()["status"] == "canceled"
    assert time.monotonic() - started < 0.5


@pytest.fixture
def redis_elsewhere(settings: Any) -> Any:
    """Point the heartbeat reader at another Redis database or port (restored afterwards)."""

    def point(url: str) -> None:
        settings.REDIS_URL = url

    yield point


def test_no_live_worker_for_the_voice_is_503_no_worker(
    make_tenant: Any, stack: Any, redis_elsewhere: Any
) -> None:
    from webapp.speech.models import SynthesisJob

    t = make_tenant()
    redis_elsewhere(stack.cfg.redis_url.rsplit("/", 1)[0] + "/15")  # reachable, no heartbeats there
    response = t.client.post("/api/v1/speech", {"text": "Anyone there?"})
    assert response.status_code == 503
    assert problem(response)["code"] == "no_worker" and int(response["Retry-After"]) > 0
    assert not SynthesisJob.objects.filter(organization=t.org).exists()


def test_redis_down_is_503_not_500(make_tenant: Any, redis_elsewhere: Any) -> None:
    t = make_tenant()
    redis_elsewhere("redis://127.0.0.1:9/0")  # nothing listens on the discard port
    response = t.client.post("/api/v1/speech", {"text": "Is Redis up?"})
    assert response.status_code == 503
    assert problem(response)["code"] == "service_unavailable" and response["Retry-After"]
    # Reading does not need Redis.
    assert t.client.get("/api/v1/speech").status_code == 200
