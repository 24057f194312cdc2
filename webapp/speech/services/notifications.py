"""Job notifications for waiters: one Redis connection per event loop, shared by all its waiters.

Each waiter used to open a pub/sub connection of its own: connect, AUTH, the client's
handshake and SUBSCRIBE, about 1.4 ms of the web process's CPU per wait, and a socket held for as
long as it waited (200 long-polls in a process were 200 Redis connections, and as many file
descriptors next to their clients' own). Now the waiters of a process share one connection: the
first waiter of a job subscribes to its channel, the last one to leave unsubscribes, and one
reader task hands each message to every waiter of its channel (one message per process and
change, however many wait on the job).

``subscribe`` returns once Redis has confirmed the channel, so anything published after that
reaches the waiter: a caller that reads the row after subscribing misses nothing between the
two. Commands are decided and written under one lock, so Redis sees SUBSCRIBE and UNSUBSCRIBE of
a channel in the order the waiters came and went; a channel left and joined again before its
confirmation counts as confirmed only once every SUBSCRIBE sent for it has been answered.

If the connection fails (Redis restarted, the socket closed, a confirmation that does not come),
every waiter on it gets :class:`NotificationsLost` and falls back to reading its row; the next
subscription opens a new connection. Nothing retries behind the waiters' backs: a silent
reconnect would hide the messages published while it was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import weakref
from typing import Any

from django.conf import settings
from redis.asyncio.connection import ConnectionPool
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

CONFIRM_SECONDS = 2.0  # a SUBSCRIBE unanswered this long: the connection is taken as lost
CONNECT_SECONDS = 2.0
# After a failed connect, waiters go straight to reading their rows for this long instead of
# queueing behind one another's connect timeouts (the row is read once a second meanwhile anyway).
DOWN_SECONDS = 1.0


class NotificationsLost(Exception):
    """The shared connection failed: what was published meanwhile may not have arrived."""


# What a listener's queue receives: (channel, message), or None once the connection is lost.
Item = tuple[str, bytes] | None


class Subscription:
    """One listener's view of a channel: the messages published on it after ``subscribe``."""

    def __init__(self, hub: Hub, channel: str, queue: asyncio.Queue[Item]) -> None:
        self.hub = hub
        self.channel = channel
        self._queue = queue
        self._closed = False

    async def get(self, timeout: float) -> bytes | None:
        """The next message, or None after ``timeout`` seconds; NotificationsLost if the connection failed."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns a result that arrives
        # with a cancellation and drops the cancellation (the client that went away).
        try:
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        if item is None:
            raise NotificationsLost("the notification connection was lost")
        return item[1]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            # Shielded: a waiter canceled while leaving (its client went away) still leaves, or
            # the channel would stay subscribed for a listener that no longer reads.
            await asyncio.shield(self.hub.leave(self.channel, self._queue))


class Hub:
    """The shared connection of one event loop and who listens on which channel."""

    def __init__(self) -> None:
        self._conn: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._listeners: dict[str, set[asyncio.Queue[Item]]] = {}
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._unanswered: dict[str, int] = {}  # SUBSCRIBEs sent and not yet confirmed, per channel
        self._down_until = 0.0  # loop time before which no connect is tried again

    async def subscribe(self, channel: str, queue: asyncio.Queue[Item] | None = None) -> Subscription:
        """Listen on ``channel``; returns once Redis has confirmed it. Raises RedisError or OSError
        when Redis cannot be reached, NotificationsLost when the connection fails meanwhile.

        ``queue``: where the messages go, shared by a listener of several channels (each item
        says its channel); by default one of the subscription's own.
        """
        queue = asyncio.Queue() if queue is None else queue
        async with self._lock:
            conn = await self._connection()
            self._listeners.setdefault(channel, set()).add(queue)
            confirmed = self._confirmed.get(channel)
            if confirmed is None:
                confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
                self._unanswered[channel] = self._unanswered.get(channel, 0) + 1
                try:
                    await conn.send_command("SUBSCRIBE", channel, check_health=False)
                except BaseException as exc:
                    self._fail(conn, exc)
                    raise
        subscription = Subscription(self, channel, queue)
        try:
            async with asyncio.timeout(CONFIRM_SECONDS):
                await asyncio.shield(confirmed)
        except TimeoutError:
            self._fail(conn, TimeoutError("Redis did not confirm a subscription"))
            raise NotificationsLost("Redis did not confirm the subscription") from None
        except BaseException:
            await subscription.close()
            raise
        return subscription

    async def leave(self, channel: str, queue: asyncio.Queue[Item]) -> None:
        async with self._lock:
            listeners = self._listeners.get(channel)
            if listeners is None or queue not in listeners:
                return  # the connection failed since: nothing is subscribed any more
            listeners.discard(queue)
            if listeners:
                return
            del self._listeners[channel]
            self._confirmed.pop(channel, None)
            conn = self._conn
            if conn is not None:
                try:
                    await conn.send_command("UNSUBSCRIBE", channel, check_health=False)
                except (RedisError, OSError) as exc:
                    self._fail(conn, exc)

    async def _connection(self) -> Any:
        if self._conn is not None:
            return self._conn
        loop = asyncio.get_running_loop()
        if loop.time() < self._down_until:
            raise NotificationsLost("Redis was unreachable a moment ago")
        # RESP2: a subscribed connection's messages are plain replies, whatever the client
        # library's default protocol (RESP3 would deliver them as pushes to a handler).
        pool = ConnectionPool.from_url(
            settings.REDIS_URL, socket_connect_timeout=CONNECT_SECONDS, socket_keepalive=True, protocol=2
        )
        conn = pool.make_connection()
        try:
            await conn.connect()
        except (RedisError, OSError):
            self._down_until = loop.time() + DOWN_SECONDS
            raise
        self._conn = conn
        self._reader = loop.create_task(self._read(conn), name="job-notifications")
        return conn

    async def _read(self, conn: Any) -> None:
        try:
            while True:
                reply = await conn.read_response(timeout=math.inf, disconnect_on_error=False)
                self._handle(reply)
        except asyncio.CancelledError:
            if self._conn is conn:  # not canceled by _fail: the loop is shutting down
                self._fail(conn, None)
                _hubs.pop(asyncio.get_running_loop(), None)
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise
        except Exception as exc:  # any failure of the connection ends it the same way
            self._fail(conn, exc)
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel = bytes(reply[0]), _text(reply[1])
        if kind == b"message":
            for queue in self._listeners.get(channel, ()):
                queue.put_nowait((channel, bytes(reply[2])))
        elif kind == b"subscribe":
            left = self._unanswered.get(channel, 1) - 1
            if left > 0:
                self._unanswered[channel] = left
                return
            self._unanswered.pop(channel, None)
            confirmed = self._confirmed.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)

    def _fail(self, conn: Any, exc: BaseException | None) -> None:
        """Tell every waiter of ``conn`` that it is gone, and forget it (the next waiter reconnects)."""
        if conn is not self._conn:
            return  # already replaced
        if exc is not None:
            log.warning("job notifications lost (waiters read their rows instead): %s", exc)
        for listeners in self._listeners.values():
            for queue in listeners:
                queue.put_nowait(None)
        for confirmed in self._confirmed.values():
            if not confirmed.done():
                confirmed.set_exception(NotificationsLost(str(exc or "closed")))
                confirmed.exception()  # retrieved: no "never retrieved" warning for unawaited ones
        self._listeners.clear()
        self._confirmed.clear()
        self._unanswered.clear()
        self._conn = None
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The running event loop's hub (a web worker has one loop; tests start a loop per call)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub()
    return found


async def subscribe(channel: str, queue: asyncio.Queue[Item] | None = None) -> Subscription:
    return await hub().subscribe(channel, queue)
