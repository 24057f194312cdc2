"""Redis locks with expiry: two runs of one housekeeping job never overlap, and one beat sends.

redis-py's :class:`redis.lock.Lock` does the work (``SET NX PX`` with a random
token; release and extend only while the token is still ours). The TTL
outlasts the Celery hard time limit, so a killed run frees the lock by itself
shortly after it died; a run that outlived its TTL finds the lock gone (or
another run's) and releases nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import redis
from redis.exceptions import LockError

from webapp import redis_clients

log = logging.getLogger("webapp.housekeeping")

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


# ----------------------------------------------------------------------------- beat's lease

BEAT_LEASE_KEY = "tts:beat:leader"


class BeatLease:
    """The one lease that lets a Celery beat send the schedule: a second beat waits for it.

    Taken before beat's first tick (``beat_init``), renewed every third of its
    TTL by a thread, released when beat exits. The holder is named in the key's
    value (host, pid), so the beat that waits says which one it waits for. A
    renewal that finds the key gone or someone else's (a Redis restarted without
    its data, a pause longer than the TTL) ends this beat at once: the other
    beat may already be sending; the supervisor restarts this one, which then
    waits. While Redis cannot be reached, the holder keeps trying and nobody can
    take it over. Two beats can overlap by at most one renewal interval, after a
    Redis that lost the key; the jobs' own locks keep runs apart even then.
    """

    def __init__(self, ttl_seconds: float, client: redis.Redis | None = None) -> None:
        self.ttl = max(1.0, float(ttl_seconds))
        self.client = client if client is not None else redis_clients.locks()
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # thread_local off: the renewing thread extends what the main thread took.
        self._lock = self.client.lock(BEAT_LEASE_KEY, timeout=self.ttl, sleep=0.5, thread_local=False)
        self._stop = threading.Event()

    def wait_and_take(self) -> None:
        """Block until the lease is ours."""
        said: str | None = None
        while True:
            try:
                if self._lock.acquire(blocking=False, token=self.token):
                    log.info("beat: holds the lease %s as %s (ttl %gs)", BEAT_LEASE_KEY, self.token, self.ttl)
                    return
                holder = self.client.get(BEAT_LEASE_KEY)
            except redis.RedisError as exc:
                holder = f"unknown (Redis: {exc})"
            holder = holder.decode() if isinstance(holder, bytes) else str(holder)
            if holder != said:  # once per holder, not once per poll
                log.warning("beat: another beat holds the lease (%s); waiting for it", holder)
                said = holder
            time.sleep(min(1.0, self.ttl / 3))

    def keep(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew the lease in a daemon thread; ``on_lost`` runs once if it was lost."""

        def renew() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    self._lock.reacquire()
                except LockError:
                    log.error("beat: lost the lease %s (taken over or gone); stopping", BEAT_LEASE_KEY)
                    on_lost()
                    return
                except redis.RedisError as exc:  # nobody else can take it while Redis is down either
                    log.warning("beat: could not renew the lease: %s", exc)

        thread = threading.Thread(target=renew, name="beat-lease", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(LockError, redis.RedisError):
            self._lock.release()
