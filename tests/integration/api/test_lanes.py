"""Lanes: a job says whether a client waits on it now (interactive) or not (batch, the default).

Workers claim interactive work first (tests/integration/worker/test_fair_claims.py); here, what
decides a job's lane and what the API says about it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.api.conftest import Tenant, problem

pytestmark = pytest.mark.usefixtures("builtin_voices")

SPEAK = {"text": "Wait a minute.", "voice": "espeak-en-us"}


@pytest.mark.usefixtures("queued_only")
def test_a_native_job_is_batch_unless_it_asks_to_be_interactive(make_tenant: Callable[..., Tenant]) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    plain = tenant.client.post("/api/v1/speech", SPEAK)
    asked = tenant.client.post("/api/v1/speech", {**SPEAK, "lane": "interactive"})
    assert plain.status_code == asked.status_code == 202, (plain.content, asked.content)
    assert (plain.json()["lane"], asked.json()["lane"]) == ("batch", "interactive")
    assert SynthesisJob.objects.get(id=asked.json()["id"]).lane == "interactive"
    assert tenant.client.get(f"/api/v1/speech/{plain.json()['id']}").json()["lane"] == "batch"


@pytest.mark.usefixtures("queued_only")
@pytest.mark.parametrize("lane", ["urgent", "", 1, None])
def test_an_unknown_lane_is_a_400_naming_the_field(make_tenant: Callable[..., Tenant], lane: object) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    r = tenant.client.post("/api/v1/speech", {**SPEAK, "lane": lane})
    assert r.status_code == 400 and problem(r).get("field") == "lane", r.content
    assert not SynthesisJob.objects.filter(organization_id=tenant.org.pk).exists()


def test_the_openai_endpoint_s_requests_are_interactive_whatever_they_send(
    make_tenant: Callable[..., Tenant],
) -> None:
    """A client of /v1/audio/speech waits on its answer; a `lane` it sends cannot make it batch."""
    from webapp.speech import submission

    tenant = make_tenant()
    for data in ({**SPEAK}, {**SPEAK, "lane": "batch"}):
        assert submission.job_request(tenant.org, data, "openai").lane == "interactive"
    assert submission.job_request(tenant.org, {**SPEAK}, "api").lane == "batch"


@pytest.mark.usefixtures("queued_only")
def test_a_full_interactive_lane_refuses_a_new_stream_at_once_and_queued_work_still_queues(
    make_tenant: Callable[..., Tenant], settings: Any
) -> None:
    import time

    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import eta

    settings.TTS_INTERACTIVE_QUEUE_PER_CHILD = 2
    limit = 2 * max(1, sum(eta.serving_children("espeak").values()))
    tenant = make_tenant(max_concurrent_jobs=100)
    for _ in range(limit):
        r = tenant.client.post("/api/v1/speech", {**SPEAK, "lane": "interactive"})
        assert r.status_code == 202, r.content
    speech = {"model": "tts-1", "input": "Hi.", "voice": "espeak-en-us"}
    for asked in ({"stream_format": "audio"}, {"stream_format": "sse"}):
        started = time.monotonic()
        full = tenant.client.post("/v1/audio/speech", {**speech, **asked})
        took = time.monotonic() - started
        assert full.status_code == 429, full.content
        assert full.json()["error"]["code"] == "interactive_lane_full"  # OpenAI's error shape there
        assert full["Retry-After"] == "1" and took < 0.1, (full["Retry-After"], took)
    # Work that does not stream is not refused: it waits its turn (interactive ones first).
    assert tenant.client.post("/api/v1/speech", {**SPEAK, "lane": "interactive"}).status_code == 202
    assert tenant.client.post("/api/v1/speech", SPEAK).status_code == 202
    lanes = SynthesisJob.objects.filter(organization_id=tenant.org.pk).values_list("lane", flat=True)
    assert sorted(lanes) == ["batch"] + ["interactive"] * (limit + 1)


@pytest.mark.usefixtures("queued_only")
def test_a_submit_answers_with_the_concurrency_in_use_and_allowed(make_tenant: Callable[..., Tenant]) -> None:
    """ElevenLabs' current-/maximum-concurrent-requests for the tenant, and the key's own share."""
    from tests.integration.api.people import key_for

    tenant = make_tenant(max_concurrent_jobs=7)
    other = key_for(tenant, None, ["speech:read", "speech:write"])
    assert other.post("/api/v1/speech", SPEAK).status_code == 202
    assert tenant.client.post("/api/v1/speech", SPEAK).status_code == 202
    r = tenant.client.post("/api/v1/speech", {**SPEAK, "lane": "interactive"})
    assert r.status_code == 202, r.content
    assert (
        r["current-concurrent-requests"],
        r["maximum-concurrent-requests"],
        r["key-current-concurrent-requests"],
    ) == ("3", "7", "2")


def test_the_openai_endpoint_answers_with_the_concurrency_headers_too(
    live_tenant: Callable[..., Tenant], web: Any, builtin_voices: list[str]
) -> None:
    """Through Nginx, both ways /v1/audio/speech answers: the whole file after its wait, and a stream."""
    import requests

    tenant = live_tenant(max_concurrent_jobs=5)
    url = f"https://127.0.0.1:{web.cfg.https_port}/v1/audio/speech"
    headers = {"Authorization": f"Bearer {tenant.raw_key}"}
    for fmt in ("wav", "pcm"):
        body = {"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": fmt}
        r = requests.post(url, json=body, headers=headers, verify=False, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["maximum-concurrent-requests"] == "5", (fmt, dict(r.headers))
        assert r.headers["current-concurrent-requests"] == r.headers["key-current-concurrent-requests"] == "1"


def _beat(engine: str, slots: int | None, state: str = "ready") -> dict[str, Any]:
    beat: dict[str, Any] = {"state": state, "engines": [engine], "device": "cpu"}
    if slots is not None:
        beat["job_slots"] = {engine: slots}
    return beat


def test_batch_work_leaves_one_job_slot_free_by_default_counting_a_batching_child_s_group(
    settings: Any,
) -> None:
    """The reservation counts job slots, not children: a GPU child batching eight jobs leaves batch
    work seven of them, two one-job children leave it one, and a lone child still runs batch work."""
    from webapp import settings as project_settings
    from webapp.speech.services import lanes

    assert project_settings.TTS_WORKER_INTERACTIVE_RESERVED == 1  # the default
    settings.TTS_WORKER_INTERACTIVE_RESERVED = 1
    assert lanes.batch_slots("piper", [_beat("piper", 8)]) == 7
    assert lanes.batch_slots("piper", [_beat("piper", 1), _beat("piper", 1)]) == 1
    assert lanes.batch_slots("piper", [_beat("piper", 1)]) == 1  # the floor: batch always progresses
    # A heartbeat from before job slots counts one; a child that is not serving counts none.
    assert lanes.batch_slots("piper", [_beat("piper", None)] * 3 + [_beat("piper", 8, "loading")]) == 2
    settings.TTS_WORKER_INTERACTIVE_RESERVED = 0
    assert lanes.batch_slots("piper", [_beat("piper", 8)]) is None


@pytest.mark.django_db(transaction=True)
def test_among_tenants_running_nothing_the_one_served_least_recently_is_claimed_first(
    make_tenant: Callable[..., Tenant], settings: Any, queued_only: None
) -> None:
    """Batch jobs one at a time (a share of one slot): every tenant runs none at each claim, and a
    burst queued first must not be served whole before another tenant's one job."""
    from django.utils import timezone

    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    a, b = make_tenant(), make_tenant()
    burst = [
        a.client.post("/api/v1/speech", {**SPEAK, "text": f"Chapter {i}."}).json()["id"] for i in range(3)
    ]
    late = b.client.post("/api/v1/speech", SPEAK).json()["id"]
    first = lifecycle.claim_next("espeak", "node:ns-1:1", batch_slots=1)
    assert first is not None and str(first.id) == burst[0]
    # A's job ends; nothing runs; A was served just now and B not at all: B's job goes next.
    SynthesisJob.objects.filter(id=first.id).update(status="succeeded", finished_at=timezone.now())
    order = [lifecycle.claim_next("espeak", f"node:ns-1:{n}") for n in range(2, 5)]
    assert [str(j.id) for j in order if j is not None] == [late, burst[1], burst[2]]
