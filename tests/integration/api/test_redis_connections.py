"""A web process keeps its Redis connections: under ASGI each request is a new context, and
Django's cache used to open (and drop) a connection per request for the rate limit."""

from __future__ import annotations

from typing import Any

from tests.integration.api.asgi_client import request
from tests.integration.api.conftest import Tenant

REQUESTS = 40


def test_requests_reuse_the_processes_redis_connections(web: Any, live_tenant: Any) -> None:
    tenant: Tenant = live_tenant()
    redis = web.redis_client()
    for _ in range(4):  # every web process has had its first requests (its pools exist)
        assert request(web, "GET", "/api/v1/speech?limit=1", tenant.raw_key).status == 200
    before = int(redis.info("stats")["total_connections_received"])
    for _ in range(REQUESTS):  # each one is rate-limited through the cache
        assert request(web, "GET", "/api/v1/speech?limit=1", tenant.raw_key).status == 200
    opened = int(redis.info("stats")["total_connections_received"]) - before
    # Before: at least one new connection per request. Now the pools' connections are reused;
    # a few may still open (a second concurrent user of a pool, the worker's own clients).
    assert opened < REQUESTS / 4, opened


def test_one_pool_per_address_and_options() -> None:
    from webapp.redis_clients import SharedConnectionPool

    a = SharedConnectionPool.from_url("redis://127.0.0.1:9/3", socket_timeout=5)
    assert SharedConnectionPool.from_url("redis://127.0.0.1:9/3", socket_timeout=5) is a
    assert SharedConnectionPool.from_url("redis://127.0.0.1:9/4", socket_timeout=5) is not a
    assert SharedConnectionPool.from_url("redis://127.0.0.1:9/3", socket_timeout=1) is not a
