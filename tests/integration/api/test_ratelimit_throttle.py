"""The tenant's rate is a DRF throttle (``TenantAPIView.throttle_classes``), counted by django-ratelimit."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory

from webapp.tenants.api.base import TenantAPIView
from webapp.tenants.ratelimit import TenantRateThrottle


class Limited(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


class Unlimited(Limited):
    throttle_classes: list[Any] = []


def _get(view: Any, raw_key: str) -> Any:
    request = APIRequestFactory().get("/api/v1/throttle-test", HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return view.as_view()(request)


def _window_with_time_left(value: str, need: int = 3) -> int:
    """The current window's end for django-ratelimit's key ``value``, with ``need`` seconds left in it."""
    from django_ratelimit.core import _get_window

    while (window := _get_window(value, 60)) - int(time.time()) < need:
        time.sleep(1)
    return window


def test_the_rate_is_counted_in_drfs_throttle_hook(make_tenant: Any) -> None:
    assert Limited.throttle_classes == [TenantRateThrottle]
    t = make_tenant(requests_per_minute=1)
    _window_with_time_left(f"org:{t.org.pk}")
    # A view without the throttle is not limited, and its answers carry no RateLimit headers.
    for _ in range(3):
        free = _get(Unlimited, t.raw_key)
        assert free.status_code == 200 and "RateLimit" not in free
    first = _get(Limited, t.raw_key)
    assert first.status_code == 200 and first["RateLimit-Policy"] == '"minute";q=1;w=60'
    limited = _get(Limited, t.raw_key)
    assert limited.status_code == 429 and limited["Retry-After"]


@pytest.mark.usefixtures("builtin_voices")
def test_django_ratelimit_counts_in_the_cache(make_tenant: Any) -> None:
    from django.core.cache import cache
    from django_ratelimit import ALL
    from django_ratelimit.core import _make_cache_key

    from webapp import redis_clients

    t = make_tenant(requests_per_minute=5)
    value = f"org:{t.org.pk}"
    window = _window_with_time_left(value)
    key = _make_cache_key("tenant", window, "5/m", value, ALL)
    assert cache.get(key) is None
    for n in (1, 2):
        assert t.client.get("/api/v1/voices").status_code == 200
        assert cache.get(key) == n  # django-ratelimit's key for the tenant's window, in Django's cache
    # It outlives the window by django-ratelimit's 5 s, as the old counter's did.
    assert 55 < redis_clients.cache().ttl(cache.make_key(key)) <= 65


def test_the_caches_incr_counts_only_an_existing_key_and_keeps_its_expiry(db: None) -> None:
    from django.core.cache import cache

    from webapp import redis_clients

    key = f"throttle-test-{time.time_ns()}"
    with pytest.raises(ValueError):
        cache.incr(key)
    assert cache.get(key) is None  # not created by the failed incr
    assert cache.add(key, 1, 30)
    assert cache.incr(key) == 2 and cache.incr(key, 3) == 5
    ttl = redis_clients.cache().ttl(cache.make_key(key))
    assert 0 < ttl <= 30
    cache.delete(key)


def test_the_cache_client_is_the_django_caches_own() -> None:
    from django.core.cache import caches

    from webapp import redis_clients

    assert caches["default"]._cache.get_client(write=True) is redis_clients.cache()  # type: ignore[attr-defined]
