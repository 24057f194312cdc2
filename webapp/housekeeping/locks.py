"""A Redis lock with expiry, so two runs of one housekeeping job never overlap.

``SET key token NX EX ttl`` takes it; a Lua check-and-delete releases it only
while it still holds our token, so a run that outlived its TTL cannot release
the lock a later run took. The TTL outlasts the Celery hard time limit, so a
killed run frees the lock by itself shortly after it died.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import redis

from webapp.speech import heartbeat

KEY_PREFIX = "tts:housekeeping:lock:"

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class RedisLock:
    def __init__(self, name: str, ttl_seconds: int, client: redis.Redis | None = None) -> None:
        self.key = KEY_PREFIX + name
        self.ttl = max(1, int(ttl_seconds))
        self.token = secrets.token_hex(16)
        self.client = client if client is not None else heartbeat.client()
        self.held = False

    def acquire(self) -> bool:
        self.held = bool(self.client.set(self.key, self.token, nx=True, ex=self.ttl))
        return self.held

    def release(self) -> bool:
        if not self.held:
            return False
        self.held = False
        return bool(self.client.eval(_RELEASE, 1, self.key, self.token))  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def hold(name: str, ttl_seconds: int) -> Iterator[bool]:
    """``with hold("expire_audio", 600) as acquired:`` - acquired is False when another run holds it."""
    lock = RedisLock(name, ttl_seconds)
    acquired = lock.acquire()
    try:
        yield acquired
    finally:
        if acquired:
            lock.release()
