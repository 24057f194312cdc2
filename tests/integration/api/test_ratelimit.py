"""Per-tenant request rate from the plan, with IETF RateLimit headers."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.integration.api.conftest import ApiClient, problem

pytestmark = pytest.mark.usefixtures("builtin_voices")

RATE_RE = re.compile(r'^"minute";r=(\d+);t=(\d+)$')


def _fresh_window(client: ApiClient) -> Any:
    """First request of the test; wait for a new window when the current one is about to end."""
    response = client.get("/api/v1/voices")
    _, reset = map(int, RATE_RE.match(response["RateLimit"]).groups())  # type: ignore[union-attr]
    if reset < 5:
        time.sleep(reset + 1)
        response = client.get("/api/v1/voices")
    return response


def test_tenant_over_its_rate_gets_429_on_every_key(make_tenant: Any) -> None:
    from webapp.tenants.services import OPERATOR, create_api_key

    t = make_tenant(requests_per_minute=3)
    first = _fresh_window(t.client)
    assert first.status_code == 200
    assert first["RateLimit-Policy"] == '"minute";q=3;w=60'
    remaining = [int(RATE_RE.match(first["RateLimit"]).group(1))]  # type: ignore[union-attr]
    for _ in range(2):
        remaining.append(int(RATE_RE.match(t.client.get("/api/v1/speech")["RateLimit"]).group(1)))  # type: ignore[union-attr]
    assert remaining == [2, 1, 0]
    limited = t.client.get("/api/v1/voices")
    assert limited.status_code == 429
    body = problem(limited)
    assert body["code"] == "rate_limited" and "3 requests" in body["detail"]
    retry = int(limited["Retry-After"])
    assert 0 < retry <= 60
    assert limited["RateLimit-Policy"] == '"minute";q=3;w=60'
    r, reset = map(int, RATE_RE.match(limited["RateLimit"]).groups())  # type: ignore[union-attr]
    assert r == 0 and reset == retry
    # The plan's rate is the tenant's (issue 12): a second key of the same tenant shares the spent budget.
    _, other = create_api_key(t.org, "second key", created_by=OPERATOR)
    assert ApiClient(other).get("/api/v1/voices").status_code == 429


def test_rate_limit_applies_to_openai_endpoint_in_openai_shape(make_tenant: Any) -> None:
    t = make_tenant(requests_per_minute=1)
    _fresh_window(t.client)
    response = t.client.post("/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "Hi."})
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert response["Retry-After"] and response["RateLimit"].startswith('"minute";r=0;')
