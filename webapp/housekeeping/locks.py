"""A Redis lock with expiry, so two runs of one housekeeping job never overlap.

redis-py's :class:`redis.lock.Lock` does the work (``SET NX PX`` with a random
token; release and extend only while the token is still ours). The TTL
outlasts the Celery hard time limit, so a killed run frees the lock by itself
shortly after it died; a run that outlived its TTL finds the lock gone (or
another run's) and releases nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis
from redis.exceptions import LockError

from webapp import redis_clients

KEY_PREFIX = "tts:housekeeping:lock:"


class RedisLock:
    """One named housekeeping lock: never waits, and a release after expiry is harmless."""

    def __init__(self, name: str, ttl_seconds: int, client: redis.Redis | None = None) -> None:
        self.key = KEY_PREFIX + name
        redis_client = client if client is not None else redis_clients.locks()
        self._lock = redis_client.lock(self.key, timeout=max(1, int(ttl_seconds)), blocking=False)
        self.held = False

    def acquire(self) -> bool:
        self.held = bool(self._lock.acquire())
        return self.held

    def release(self) -> bool:
        """True when our lock was released; False when it was not ours (any more)."""
        if not self.held:
            return False
        self.held = False
        try:
            self._lock.release()
        except LockError:  # expired, or taken by a later run meanwhile: nothing of ours to free
            return False
        return True


@contextlib.contextmanager
def hold(name: str, ttl_seconds: int) -> Iterator[bool]:
    """``with hold("expire_audio", 600) as acquired:`` - acquired is False when another run holds it."""
    lock = RedisLock(name, ttl_seconds)
    acquired = lock.acquire()
    try:
        yield acquired
    finally:
        lock.release()
