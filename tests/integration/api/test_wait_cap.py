"""Every kind of wait counts against the tenant's cap: the dashboard's long-poll and /stream too.

The cap (``Plan.max_concurrent_waits``) is filled here with real slots in the
test stack's Redis (``services.waits.acquire``), as waits in progress on other
web processes would hold them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from tests.dashboard_data import make_job, make_owner
from tests.integration.api.conftest import problem

CAP = 2


@pytest.fixture
def full(stack: Any, db: None) -> Iterator[tuple[Any, Any]]:
    """An owner whose tenant has all of its CAP wait slots in use."""
    from webapp.speech.services import waits

    user, org = make_owner()
    org.plan.max_concurrent_waits = CAP
    org.plan.save()
    redis_key = waits.key(org.pk)
    tokens = [waits.acquire(org, 30) for _ in range(CAP)]
    assert None not in tokens
    yield user, org
    for token in tokens:
        waits.release(org.pk, token)
    assert waits.in_use(org.pk) == 0, redis_key


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_dashboards_long_poll_counts_against_the_cap(full: tuple[Any, Any]) -> None:
    user, org = full
    job = make_job(org, user, status="running", progress=0.1)
    client = _client(user)
    refused = client.get(f"/app/jobs/{job.pk}/?wait=5")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "1"
    assert "concurrent waits" in refused.json()["detail"]  # problem+json, as the API answers
    # Without a wait nothing is counted.
    assert client.get(f"/app/jobs/{job.pk}/").json()["progress"] == 0.1


def test_a_wait_of_thousands_of_digits_is_no_500(stack: Any, db: None) -> None:
    user, org = make_owner()
    job = make_job(org, user, status="succeeded")
    client = _client(user)
    for raw in ("9" * 5000, "1" + "0" * 4400, "٣", "-1", "1e3"):
        response = client.get(f"/app/jobs/{job.pk}/", {"wait": raw})
        assert response.status_code == 200, (raw[:10], response.status_code)
        assert response.json()["status"] == "succeeded"


def test_a_stream_of_a_running_job_counts_against_the_cap(stack: Any, db: None) -> None:
    from tests.integration.api.conftest import ApiClient
    from webapp.speech.services import waits
    from webapp.tenants.services import OPERATOR, create_api_key

    user, org = make_owner()
    org.plan.max_concurrent_waits = 1
    org.plan.save()
    _, raw = create_api_key(org, "reader", created_by=OPERATOR, scopes=["speech:read"])
    api = ApiClient(raw)
    job = make_job(org, user, status="running", progress=0.1, format="pcm")
    first = api.get(f"/api/v1/speech/{job.pk}/stream")
    assert first.status_code == 200 and first.streaming
    try:
        # The open stream holds the tenant's one slot: a second is refused before it starts.
        assert waits.in_use(org.pk) == 1
        refused = api.get(f"/api/v1/speech/{job.pk}/stream")
        assert refused.status_code == 429
        assert problem(refused)["code"] == "too_many_waits" and refused["Retry-After"] == "1"
    finally:
        first.close()
    assert waits.in_use(org.pk) == 0  # given back when the response closed
