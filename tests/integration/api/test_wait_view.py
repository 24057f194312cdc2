"""The waiting endpoints are async views whose sync part is DRF's: a request DRF refuses takes no wait slot."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.api.conftest import Tenant, problem
from tests.integration.api.direct_jobs import submit_espeak

JOB_PATH = "/api/v1/speech/00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    "path", [JOB_PATH, "/v1/audio/speech", "/app/jobs/00000000-0000-0000-0000-000000000000/"]
)
def test_the_waiting_views_are_coroutine_functions(path: str) -> None:
    from django.urls import resolve

    assert asyncio.iscoroutinefunction(resolve(path).func)


@pytest.fixture
def slots_taken(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The organisations a wait slot was asked for (the real acquire runs)."""
    from webapp.speech.services import dispatch, waits

    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)  # the job stays queued
    asked: list[Any] = []
    real = waits.acquire

    def acquire(organization: Any, seconds: float) -> str | None:
        asked.append(organization.pk)
        return real(organization, seconds)

    monkeypatch.setattr(waits, "acquire", acquire)
    return asked


@pytest.mark.parametrize("who", ["no key", "unknown key", "key without speech:read"])
def test_a_wait_refused_before_the_view_takes_no_wait_slot(
    make_tenant: Any, builtin_voices: list[str], slots_taken: list[Any], who: str
) -> None:
    from tests.integration.api.conftest import ApiClient
    from webapp.speech.services import waits

    tenant: Tenant = make_tenant(max_concurrent_waits=2)
    job = submit_espeak(tenant.org)
    client = {
        "no key": ApiClient(None),
        "unknown key": ApiClient("tts_AAAAAAAA_" + "x" * 40),
        "key without speech:read": make_tenant(scopes=["voices:write"]).client,
    }[who]
    refused = client.get(f"/api/v1/speech/{job.id}", {"wait": "5"})
    assert refused.status_code == (403 if who.startswith("key without") else 401)
    assert problem(refused)["status"] == refused.status_code
    assert slots_taken == []
    assert waits.in_use(tenant.org.pk) == 0
    openai = client.post("/v1/audio/speech", {"model": "tts-1", "input": "Hi.", "voice": "alloy"})
    assert openai.status_code in (401, 403)
    assert slots_taken == [] and waits.in_use(tenant.org.pk) == 0

    # The same wait with the tenant's own key takes one slot, and gives it back.
    waited = tenant.client.get(f"/api/v1/speech/{job.id}", {"wait": "1"})
    assert waited.status_code == 200 and waited.json()["status"] == "queued"
    assert "RateLimit" in waited
    assert slots_taken == [tenant.org.pk]
    assert waits.in_use(tenant.org.pk) == 0
