"""Rates that follow the tenant: one budget across its keys, a key's own lower rate, Redis down."""

from __future__ import annotations

import re
import time
import zlib
from typing import Any

import pytest
from django.test import override_settings

from tests.integration.api.conftest import ApiClient, problem

pytestmark = pytest.mark.usefixtures("builtin_voices")

RATE_RE = re.compile(r'^"minute";r=(\d+);t=(\d+)$')


def _seconds_left(counter: str) -> int:
    """Seconds left in the fixed window the rate limit uses for this counter (offset by its name)."""
    now = int(time.time())
    end = now - now % 60 + zlib.crc32(counter.encode()) % 60
    return end - now if end >= now else end + 60 - now


def _fresh_windows(*counters: str, need: int = 3) -> None:
    """Start the test where no window ends in the next ``need`` seconds."""
    while min(_seconds_left(c) for c in counters) < need:
        time.sleep(1)


def _remaining(response: Any) -> int:
    return int(RATE_RE.match(response["RateLimit"]).group(1))  # type: ignore[union-attr]


def test_the_plans_rate_is_one_budget_for_all_keys_of_a_tenant(make_tenant: Any) -> None:
    from webapp.tenants.services import OPERATOR, create_api_key

    t = make_tenant(requests_per_minute=4)
    bystander = make_tenant(requests_per_minute=4)
    keys = [t.client, *(ApiClient(create_api_key(t.org, f"k{n}", created_by=OPERATOR)[1]) for n in range(2))]
    _fresh_windows(f"org:{t.org.pk}", f"org:{bystander.org.pk}")
    seen = [_remaining(keys[n % 3].get("/api/v1/voices")) for n in range(4)]
    assert seen == [3, 2, 1, 0]
    for client in keys:
        limited = client.get("/api/v1/speech")
        assert limited.status_code == 429
        assert (
            "this tenant" in problem(limited)["detail"] and limited["RateLimit-Policy"] == '"minute";q=4;w=60'
        )
    # Another tenant has a budget of its own.
    assert bystander.client.get("/api/v1/voices").status_code == 200


def test_a_keys_own_lower_rate_binds_and_the_headers_show_it(make_tenant: Any) -> None:
    from webapp.tenants.services import OPERATOR, create_api_key

    t = make_tenant(requests_per_minute=10)
    slow, raw = create_api_key(t.org, "slow", created_by=OPERATOR, requests_per_minute=2)
    slow_client = ApiClient(raw)
    _fresh_windows(f"org:{t.org.pk}", f"key:{slow.pk}")
    first = slow_client.get("/api/v1/voices")
    assert first["RateLimit-Policy"] == '"minute";q=2;w=60' and _remaining(first) == 1
    reset = int(RATE_RE.match(first["RateLimit"]).group(2))  # type: ignore[union-attr]
    assert (
        abs(reset - _seconds_left(f"key:{slow.pk}")) <= 1
    )  # the windows this test waits on are the real ones
    assert slow_client.get("/api/v1/voices").status_code == 200
    limited = slow_client.get("/api/v1/voices")
    assert limited.status_code == 429 and "this API key" in problem(limited)["detail"]
    assert limited["RateLimit-Policy"] == '"minute";q=2;w=60' and limited["Retry-After"]
    # The tenant's other key is not held back by it, and counts against the same tenant budget (3 used).
    other = t.client.get("/api/v1/voices")
    assert other.status_code == 200
    assert other["RateLimit-Policy"] == '"minute";q=10;w=60' and _remaining(other) == 6


def test_a_key_rate_above_the_plans_leaves_the_plan_binding(make_tenant: Any) -> None:
    from webapp.tenants.services import OPERATOR, create_api_key

    t = make_tenant(requests_per_minute=3)
    fast, raw = create_api_key(t.org, "fast", created_by=OPERATOR, requests_per_minute=100)
    _fresh_windows(f"org:{t.org.pk}", f"key:{fast.pk}")
    response = ApiClient(raw).get("/api/v1/voices")
    assert response["RateLimit-Policy"] == '"minute";q=3;w=60' and _remaining(response) == 2


DEAD_REDIS = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        # Nothing listens here: the injected fault is a Redis that is down.
        "LOCATION": "redis://127.0.0.1:9/0",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}


def test_with_redis_down_writes_fail_closed_and_reads_go_through(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob
    from webapp.tenants.models import ApiKey

    t = make_tenant(requests_per_minute=1000)
    with override_settings(CACHES=DEAD_REDIS):
        write = t.client.post("/api/v1/speech", {"text": "Not while the limit cannot count."})
        assert write.status_code == 503 and int(write["Retry-After"]) > 0
        assert problem(write)["code"] == "service_unavailable"
        assert not SynthesisJob.objects.filter(organization=t.org).exists()
        created = t.client.post("/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "Hi."})
        assert created.status_code == 503 and created["Retry-After"]
        assert created.json()["error"]["code"] == "service_unavailable"
        read = t.client.get("/api/v1/voices")
        assert read.status_code == 200 and "RateLimit" not in read
    assert ApiKey.objects.filter(organization=t.org).count() == 1
