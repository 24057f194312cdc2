"""One Redis connection pool per process for Django's cache, not one per request.

Django keeps a cache backend per context, and under ASGI every request is a new
context: each request built a new ``RedisCacheClient``, a new pool and so a new
connection (TCP connect, AUTH, and redis-py's per-connection package-metadata
lookup), used once for the rate limit and dropped. Measured with py-spy on a
web worker serving one client's GETs, opening those connections was about a
tenth of the worker's CPU. Django builds its pools through ``pool_class.from_url``
(the cache's ``OPTIONS``); this class hands every caller the process's one pool
for that address. redis-py's pools are thread-safe and reset themselves in a
forked child.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

_pools: dict[tuple[str, str], redis.ConnectionPool] = {}
_lock = threading.Lock()


class SharedConnectionPool(redis.ConnectionPool):
    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Any:
        key = (url, repr(sorted(kwargs.items(), key=lambda item: item[0])))
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = redis.ConnectionPool.from_url(url, **kwargs)
            return pool
