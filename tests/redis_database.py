"""A Redis database of a test's own: made-up heartbeats reach no other test's workers, and it can be emptied."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.test import override_settings


@contextlib.contextmanager
def redis_database(stack: Any, db: int) -> Iterator[Any]:
    """``REDIS_URL`` (and the heartbeat client) on Redis database ``db``, emptied before and after."""
    from webapp.speech import heartbeat

    url = stack.cfg.redis_url.rsplit("/", 1)[0] + f"/{db}"
    with override_settings(REDIS_URL=url):
        heartbeat._client = None
        r = heartbeat.client()
        r.flushdb()
        try:
            yield r
        finally:
            r.flushdb()
            heartbeat._client = None


def clear_cache() -> None:
    """Empty Django's cache and the request-rate counters, and nothing else in their Redis database.

    ``cache.clear()`` runs FLUSHDB, and the cache shares its database with Celery's queues and the
    workers' heartbeats: the session worker then looks gone until its next beat (a submit gets
    503 no_worker, /healthz fails) and queued messages are lost.
    """
    from django.core.cache import cache

    from webapp.tenants.api import ratelimit

    client, prefix = ratelimit._cache_redis()  # the cache's Redis, through the process's pool
    for pattern in (cache.make_key("*"), f"{prefix}:{ratelimit.KEY_TAG}:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
