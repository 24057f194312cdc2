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
