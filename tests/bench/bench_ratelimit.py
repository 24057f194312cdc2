"""CPU of the request-rate check, side by side: `python -m tests.bench ratelimit [--quick]`.

Against the test stack's Redis, N checks of one made-up tenant (a plan rate far
above N, so every check is counted and none refused), through:

* old counter: the hand-written one this replaced (``tenants/api/ratelimit.py``
  before django-ratelimit, copied below: a pipelined ``SET NX EX`` + ``INCR`` on
  a client of the cache's shared pool, one round trip a budget);
* django-ratelimit: ``TenantRateThrottle`` as DRF calls it (``get_usage``:
  ``add``, then ``incr`` = ``EXISTS`` + ``INCRBY``, through the site's cache
  backend, ``webapp.redis_clients.RedisCache``);
* django-ratelimit, Django's stock backend: the same through
  ``django.core.cache.backends.redis.RedisCache``, which builds a ``redis.Redis``
  for every cache call (what the site's backend saves).

Each for the tenant's budget alone and for a key with its own rate (two
budgets), and each check in a fresh context as under ASGI, where every request
gets a new cache backend object (``caches`` is per context). Figures are CPU
(``time.process_time``) and wall time per check, in ms, over interleaved rounds.
"""

from __future__ import annotations

import contextvars
import statistics
import time
import uuid
import zlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from tests.bench.bench_worker import _setup

ROUNDS = 3


# --- the old counter, as it was (webapp/tenants/api/ratelimit.py before django-ratelimit) ---------
_old_clients: dict[int, Any] = {}


def _old_cache_redis() -> tuple[Any, str]:
    import redis
    from django.conf import settings

    from webapp.redis_clients import shared_pool

    cache: dict[str, Any] = settings.CACHES["default"]
    options = {k: v for k, v in cache.get("OPTIONS", {}).items() if k != "pool_class"}
    pool = shared_pool(str(cache["LOCATION"]), **options)
    client = _old_clients.get(id(pool))
    if client is None:
        client = _old_clients[id(pool)] = redis.Redis(connection_pool=pool)
    return client, str(cache.get("KEY_PREFIX", ""))


def _old_window_end(counter: str, now: int) -> int:
    end = now - now % 60 + zlib.crc32(counter.encode()) % 60
    return end if end >= now else end + 60


def _old_count(counter: str, limit: int) -> tuple[int, int, int]:
    now = int(time.time())
    end = _old_window_end(counter, now)
    client, prefix = _old_cache_redis()
    key = f"{prefix}:rate:{counter}:{end}"
    pipe = client.pipeline(transaction=False)
    pipe.set(key, 0, ex=end - now + 5, nx=True)
    pipe.incr(key)
    count = int(pipe.execute()[1])
    return limit, max(0, limit - count), max(1, end - int(time.time()))


def _old_check(request: Any) -> Any:
    org, auth = request.user.organization, request.auth
    budgets = [(f"org:{org.pk}", int(org.plan.requests_per_minute))]
    if auth is not None and auth.requests_per_minute is not None:
        budgets.append((f"key:{auth.pk}", int(auth.requests_per_minute)))
    usages = [_old_count(counter, limit) for counter, limit in budgets]
    return min(usages, key=lambda u: (u[1], u[0]))


# --- the new throttle -------------------------------------------------------------------------------
def _new_check(request: Any) -> Any:
    from webapp.tenants.ratelimit import TenantRateThrottle

    assert TenantRateThrottle().allow_request(request, None)
    return request.rate_usage


def _request(n: int, key_rate: bool) -> Any:
    from webapp.tenants.models import ApiKey, Organization, Plan

    plan = Plan(name="bench", requests_per_minute=100 * n)
    org = Organization(id=uuid.uuid4(), name="bench", plan=plan)
    key = ApiKey(id=uuid.uuid4(), organization=org, requests_per_minute=50 * n if key_rate else None)
    user = SimpleNamespace(is_authenticated=True, organization=org)
    return SimpleNamespace(method="GET", user=user, auth=key)


def _time(check: Callable[[Any], Any], n: int, key_rate: bool) -> tuple[float, float]:
    """(CPU ms, wall ms) per check, each check in a context of its own (a new ASGI request)."""
    request = _request(n, key_rate)
    for _ in range(20):  # warm: connections, the first cache objects
        contextvars.Context().run(check, request)
    request = _request(n, key_rate)  # fresh counters
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        contextvars.Context().run(check, request)
    return (time.process_time() - cpu) * 1000 / n, (time.perf_counter() - wall) * 1000 / n


STOCK_CACHE = "django.core.cache.backends.redis.RedisCache"


def _variants() -> dict[str, tuple[Callable[[Any], Any], str | None]]:
    return {
        "old counter": (_old_check, None),
        "django-ratelimit": (_new_check, None),
        "django-ratelimit, stock backend": (_new_check, STOCK_CACHE),
    }


def measure(n: int) -> list[str]:
    from django.conf import settings
    from django.test import override_settings

    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(ROUNDS):  # interleaved: the load of a shared machine drifts
        for key_rate in (False, True):
            for name, (check, backend) in _variants().items():
                caches = {"default": {**settings.CACHES["default"], "BACKEND": backend or ""}}
                if backend is None:
                    caches = settings.CACHES
                with override_settings(CACHES=caches):
                    results.setdefault((name, key_rate), []).append(_time(check, n, key_rate))
    lines = [
        f"| check ({n} a round, {ROUNDS} rounds, fresh context each) | budgets | CPU ms/check | wall ms/check |",
        "|---|---|---|---|",
    ]
    for (name, key_rate), samples in results.items():
        cpu = statistics.median(s[0] for s in samples)
        wall = statistics.median(s[1] for s in samples)
        budgets = "tenant + key" if key_rate else "tenant"
        lines.append(f"| {name} | {budgets} | {cpu:.3f} | {wall:.3f} |")
    return lines


def run(quick: bool) -> list[str]:
    stack, owned = _setup()
    try:
        lines = measure(300 if quick else 2000)
    finally:
        if owned:
            stack.stop_all()
    print("\n".join(lines))
    return lines
