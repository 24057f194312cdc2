"""A Redis database of a test's own: made-up heartbeats reach no other test's workers, and it can be emptied."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.test import override_settings


@contextlib.contextmanager
def redis_database(stack: Any, db: int) -> Iterator[Any]:
    """``REDIS_URL`` (and so the clients of ``webapp.redis_clients``) on Redis database ``db``,
    emptied before and after."""
    from webapp import redis_clients

    url = stack.cfg.redis_url.rsplit("/", 1)[0] + f"/{db}"
    with override_settings(REDIS_URL=url):
        r = redis_clients.heartbeats()
        r.flushdb()
        try:
            yield r
        finally:
            r.flushdb()


def clear_cache() -> None:
    """Empty Django's cache (the request-rate counters are django-ratelimit's keys in it), and
    nothing else in its Redis database.

    ``cache.clear()`` runs FLUSHDB, and the cache shares its database with Celery's queues and the
    workers' heartbeats: the session worker then looks gone until its next beat (a submit gets
    503 no_worker, /healthz fails) and queued messages are lost.
    """
    from django.core.cache import cache

    from webapp import redis_clients

    client = redis_clients.cache()  # the cache's own client, on the process's pool
    keys = list(client.scan_iter(match=cache.make_key("*"), count=1000))
    if keys:
        client.delete(*keys)
