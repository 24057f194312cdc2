"""Every Redis client of the site, by name, each on a connection pool shared by the process.

* :func:`cache`: the client Django's cache uses (``CACHES["default"]``: the rate
  limits' counters, django-ratelimit's keys), the very ``redis.Redis`` object;
* :func:`heartbeats`: the workers' beats, recycling turns and plans, metrics
  counters, /healthz's ping: ``REDIS_URL``, replies decoded;
* :func:`notifications`: job-change and stream-growth messages published, and
  the long-polls' wait slots;
* :func:`locks`: the housekeeping locks;
* :func:`subscriptions`: the sync streams' subscriptions (a subscribed
  connection waits for messages, so no read timeout, and its own pool).

heartbeats, notifications and locks share one pool. Every client follows the
current ``settings.REDIS_URL`` (tests point it elsewhere with override_settings).

Why a shared pool. Django keeps a cache backend per context, and under ASGI
every request is a new context: each request built a new ``RedisCacheClient``,
a new pool and so a new connection (TCP connect, AUTH, and redis-py's
per-connection package-metadata lookup), used once for the rate limit and
dropped. Measured with py-spy on a web worker serving one client's GETs,
opening those connections was about a tenth of the worker's CPU. Django builds
its pools through ``pool_class.from_url`` (the cache's ``OPTIONS``):
:class:`SharedConnectionPool` hands every caller the process's one pool for
that address and options. Django also builds a ``redis.Redis`` for every cache
call (about 0.1 ms of CPU each: its reply callbacks); :class:`RedisCache` reuses
one per pool, and counts (``incr``, django-ratelimit's) in one round trip, not two. redis-py's pools are thread-safe and reset themselves in a forked
child; its hiredis reply parser is used when installed (the cache's pool names
redis-py's ``DefaultParser``, as Django does).

This module sits at the bottom of the site's layers: it imports nothing of
``webapp`` (settings through ``django.conf``).
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.utils.module_loading import import_string

_pools: dict[tuple[str, str], redis.ConnectionPool] = {}
_clients: dict[tuple[str, int], redis.Redis] = {}
_lock = threading.Lock()

# heartbeats, notifications, locks: short timeouts, so a stalled Redis fails a call, not a thread.
_GENERAL_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 2,
    "socket_timeout": 3,
    "decode_responses": True,
}
_SUBSCRIPTION_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 2}


def shared_pool(url: str, **options: Any) -> redis.ConnectionPool:
    """The process's one pool for this address and these options."""
    key = (url, repr(sorted(options.items(), key=lambda item: item[0])))
    pool = _pools.get(key)
    if pool is None:
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = redis.ConnectionPool.from_url(url, **options)
    return pool


class SharedConnectionPool(redis.ConnectionPool):
    """The cache's ``pool_class``: ``from_url`` gives the process's shared pool."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Any:
        return shared_pool(url, **kwargs)


def _client(name: str, pool: redis.ConnectionPool) -> redis.Redis:
    key = (name, id(pool))
    client = _clients.get(key)
    if client is None:  # one client per name and pool: building one sets up its reply callbacks
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = redis.Redis(connection_pool=pool)
    return client


# INCRBY only where the key exists, in one round trip. Django's incr is EXISTS, then INCRBY: two
# round trips (each about 0.1 ms of CPU, mostly the socket calls), and a key that expires between
# them comes back without its expiry.
_INCR_EXISTING = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end
return false
"""
_scripts: dict[int, Any] = {}


class _CacheClient(RedisCacheClient):
    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        # Django's own pool choice (the server to write to, else one to read from).
        return _client("cache", self._get_connection_pool(write))  # type: ignore[attr-defined]

    def incr(self, key: Any, delta: int) -> Any:
        client = self.get_client(key, write=True)
        script = _scripts.get(id(client))
        if script is None:  # EVALSHA, loading the script again where Redis has lost it
            script = _scripts[id(client)] = client.register_script(_INCR_EXISTING)
        value = script(keys=[key], args=[delta])
        if value is None:
            raise ValueError(f"Key '{key}' not found.")  # as Django's
        return value


class RedisCache(DjangoRedisCache):
    """Django's Redis cache, one ``redis.Redis`` per pool instead of one per call.

    Errors are not swallowed (nor are they in Django's backend): a caller that
    must decide what an unreachable Redis means (the rate limits) sees it.
    """

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _CacheClient


def cache() -> redis.Redis:
    """The client of the cache's Redis that Django's cache itself uses (same pool, same object)."""
    config: dict[str, Any] = settings.CACHES["default"]
    # The pool's options as Django's RedisCacheClient passes them, so the key is the same pool's.
    options = {k: v for k, v in config.get("OPTIONS", {}).items() if k not in ("pool_class", "serializer")}
    parser = options.get("parser_class") or redis.connection.DefaultParser
    options["parser_class"] = import_string(parser) if isinstance(parser, str) else parser
    location = str(config["LOCATION"]).split(",")[0].split(";")[0]  # the server Django writes to
    return _client("cache", shared_pool(location, **options))


def heartbeats() -> redis.Redis:
    return _client("heartbeats", shared_pool(settings.REDIS_URL, **_GENERAL_OPTIONS))


def notifications() -> redis.Redis:
    return _client("notifications", shared_pool(settings.REDIS_URL, **_GENERAL_OPTIONS))


def locks() -> redis.Redis:
    return _client("locks", shared_pool(settings.REDIS_URL, **_GENERAL_OPTIONS))


def subscriptions() -> redis.Redis:
    """For ``pubsub()``: each subscription holds one of this pool's connections while it lasts."""
    return _client("subscriptions", shared_pool(settings.REDIS_URL, **_SUBSCRIPTION_OPTIONS))
