"""Request rates that follow the tenant, with IETF RateLimit headers.

The plan's ``requests_per_minute`` is one budget for the whole tenant, shared
by all its keys; a key may also carry a lower rate of its own
(``ApiKey.requests_per_minute``). Both are counted in the cache's Redis in
fixed one-minute windows, each offset by a hash of its counter's name so the
windows of all tenants do not end at the same second; every gunicorn worker
on every node sees one counter. Counting a request is one round trip (a
``SET NX`` that starts the window's counter with its expiry, and an
``INCR``), where django-ratelimit's cache calls took three. The headers show
the limit that binds: the one exceeded, or else the one with the fewest
requests left::

    RateLimit-Policy: "minute";q=60;w=60
    RateLimit: "minute";r=12;t=31

When Redis cannot count, writes fail closed (503 with Retry-After: nothing is
submitted that the limit could not see) and reads go through unlimited and
without headers (reading a job must not need the cache).
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from redis.exceptions import RedisError

from webapp.errors import ErrorCode
from webapp.problems import Problem
from webapp.redis_pool import SharedConnectionPool
from webapp.tenants.models import ApiKey, Organization

log = logging.getLogger(__name__)

POLICY = "minute"
WINDOW_SECONDS = 60
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# How long a client should wait when the counter is unreachable: about the
# time a Redis restart takes.
UNAVAILABLE_RETRY_AFTER = 5
# A window's counter outlives the window by this much (a request counted in its last second).
EXPIRY_MARGIN_SECONDS = 5
# A counter's key: "<cache prefix>:rate:<counter>:<window end>".
KEY_TAG = "rate"


@dataclass(frozen=True)
class RateUsage:
    limit: int
    remaining: int
    reset: int
    exceeded: bool
    # Whose budget it is: "tenant" or "key".
    scope: str

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Policy": f'"{POLICY}";q={self.limit};w={WINDOW_SECONDS}',
            "RateLimit": f'"{POLICY}";r={self.remaining};t={self.reset}',
        }


def _budgets(request: Any, organization: Organization) -> list[tuple[str, str, int]]:
    """(scope, counter name, limit) for each budget this request draws on; none for anonymous requests."""
    auth = getattr(request, "auth", None)
    user = getattr(request, "user", None)
    if not isinstance(auth, ApiKey) and not getattr(user, "is_authenticated", False):
        return []
    budgets = [("tenant", f"org:{organization.pk}", int(organization.plan.requests_per_minute))]
    if isinstance(auth, ApiKey) and auth.requests_per_minute is not None:
        budgets.append(("key", f"key:{auth.pk}", int(auth.requests_per_minute)))
    return budgets


def window_end(counter: str, now: int) -> int:
    """When the counter's current window ends (unix seconds): minute edges shifted by a hash of its name."""
    end = now - now % WINDOW_SECONDS + zlib.crc32(counter.encode()) % WINDOW_SECONDS
    return end if end >= now else end + WINDOW_SECONDS


_clients: dict[int, redis.Redis] = {}


def _cache_redis() -> tuple[redis.Redis, str]:
    """A client of the cache's Redis (the process's shared pool) and the cache's key prefix."""
    cache: dict[str, Any] = settings.CACHES["default"]
    options = {k: v for k, v in cache.get("OPTIONS", {}).items() if k != "pool_class"}
    pool = SharedConnectionPool.from_url(str(cache["LOCATION"]), **options)
    client = _clients.get(id(pool))
    if client is None:  # a client per pool: building one sets up its reply callbacks
        client = _clients[id(pool)] = redis.Redis(connection_pool=pool)
    return client, str(cache.get("KEY_PREFIX", ""))


def _count(counter: str, limit: int, scope: str) -> RateUsage:
    now = int(time.time())
    end = window_end(counter, now)
    client, prefix = _cache_redis()
    key = f"{prefix}:{KEY_TAG}:{counter}:{end}"
    pipe = client.pipeline(transaction=False)
    pipe.set(key, 0, ex=end - now + EXPIRY_MARGIN_SECONDS, nx=True)
    pipe.incr(key)
    count = int(pipe.execute()[1])
    return RateUsage(
        limit=limit,
        remaining=max(0, limit - count),
        reset=max(1, end - int(time.time())),
        exceeded=count > limit,
        scope=scope,
    )


def _binding(usages: list[RateUsage]) -> RateUsage:
    exceeded = [usage for usage in usages if usage.exceeded]
    candidates = exceeded or usages
    return min(candidates, key=lambda usage: (usage.remaining, usage.limit))


def check_rate(request: Any, organization: Organization | None) -> RateUsage | None:
    """Count this request against each budget; a 429 Problem when one is spent. None when not limited."""
    if not settings.TTS_RATELIMIT_ENABLED or organization is None:
        return None
    budgets = _budgets(request, organization)
    if not budgets:
        return None
    try:
        usages = [_count(counter, limit, scope) for scope, counter, limit in budgets]
    except (RedisError, ConnectionError, OSError) as exc:
        if request.method in SAFE_METHODS:
            log.warning("rate limit not counted for a read, cache unavailable: %s", exc)
            return None
        log.warning("write refused, rate limit cache unavailable: %s", exc)
        raise Problem(
            503,
            ErrorCode.SERVICE_UNAVAILABLE,
            "The request rate cannot be checked right now; try again shortly.",
            retry_after=UNAVAILABLE_RETRY_AFTER,
        ) from exc
    binding = _binding(usages)
    if binding.exceeded:
        whose = "this tenant" if binding.scope == "tenant" else "this API key"
        problem = Problem(
            429,
            ErrorCode.RATE_LIMITED,
            f"More than {binding.limit:,} requests in a minute for {whose}; try again in {binding.reset} s.",
            retry_after=binding.reset,
        )
        problem.extra_headers = binding.headers()
        raise problem
    return binding
