"""What wakes a stream: the job's notifications, not a timer.

A stream subscribes to two channels of its job before it reads anything
(``services.notify``): the job's state changes (claimed, finished, handed on)
and its stream file's growth (the worker publishes after each sentence and at
the end). So a message published between a read and the wait is not missed:
it waits in the subscription. A stream then reads the file when told, and
re-reads the row when the job's channel speaks (or at a slow safety interval,
should a message be lost). Without Redis it falls back to looking at the file
every ``POLL_SECONDS`` and the row every ``POLL_ROW_CHECK_SECONDS``. Under ASGI
the subscriptions go through the event loop's one shared connection
(``services.notifications``); under WSGI through ``redis_clients.subscriptions()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from webapp import redis_clients
from webapp.speech.services import notifications
from webapp.speech.services.notifications import Item, NotificationsLost, Subscription
from webapp.speech.services.notify import channel, stream_channel

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05  # without notifications: how often the stream file is looked at
POLL_ROW_CHECK_SECONDS = 0.5  # without notifications: how often the row is re-read
# With notifications, a lost message delays a stream by at most this (file and row).
SAFETY_SECONDS = 2.0


class Wakeups:
    """A stream's subscription; ``row_changed`` says a state change was announced since the last wait."""

    def __init__(self, job_id: Any) -> None:
        self.job_channel = channel(job_id)
        self.channels = (self.job_channel, stream_channel(job_id))
        self.pubsub: Any = None
        self.row_changed = False

    @property
    def row_check_seconds(self) -> float:
        return POLL_ROW_CHECK_SECONDS if self.pubsub is None else SAFETY_SECONDS

    def _note(self, message: dict[str, Any] | None) -> None:
        if message is not None and message.get("type") == "message":
            name = message.get("channel")
            name = name.decode() if isinstance(name, bytes) else name
            self.row_changed = self.row_changed or name == self.job_channel

    def _lost(self, exc: BaseException) -> None:
        log.warning("stream notifications lost (looking at the file every %.2f s): %s", POLL_SECONDS, exc)
        self.pubsub = None

    def take_row_changed(self) -> bool:
        changed, self.row_changed = self.row_changed, False
        return changed


class SyncWakeups(Wakeups):
    """For a stream iterated by a WSGI thread."""

    def __init__(self, job_id: Any) -> None:
        super().__init__(job_id)
        try:
            pubsub = redis_clients.subscriptions().pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(*self.channels)
            self.pubsub = pubsub
        except (RedisError, OSError) as exc:
            self._lost(exc)

    def wait(self) -> None:
        """Until a notification (then whatever else is already there), the safety interval, or a poll."""
        if self.pubsub is None:
            time.sleep(POLL_SECONDS)
            return
        try:
            self._note(self.pubsub.get_message(timeout=SAFETY_SECONDS))
            while (message := self.pubsub.get_message(timeout=0)) is not None:
                self._note(message)
        except (RedisError, OSError) as exc:
            self.close()
            self._lost(exc)

    def close(self) -> None:
        if self.pubsub is not None:
            try:
                self.pubsub.close()  # its connection goes back to the pool
            except (RedisError, OSError):
                pass


class AsyncWakeups(Wakeups):
    """For a stream iterated by the ASGI event loop: both channels on the loop's one shared Redis
    connection (``services.notifications``), confirmed by Redis before ``open`` returns."""

    def __init__(self, job_id: Any) -> None:
        super().__init__(job_id)
        self._subscriptions: list[Subscription] = []

    async def open(self) -> AsyncWakeups:
        queue: asyncio.Queue[Item] = asyncio.Queue()  # both channels' messages, each with its channel
        try:
            for name in self.channels:
                self._subscriptions.append(await notifications.subscribe(name, queue))
            self.pubsub = queue
        except (RedisError, OSError, NotificationsLost) as exc:
            await self.close()
            self._lost(exc)
        return self

    async def wait(self) -> None:
        if self.pubsub is None:
            await asyncio.sleep(POLL_SECONDS)
            return
        queue: asyncio.Queue[Item] = self.pubsub
        try:
            async with asyncio.timeout(SAFETY_SECONDS):
                items = [await queue.get()]
        except TimeoutError:
            return
        while not queue.empty():  # whatever else is already there
            items.append(queue.get_nowait())
        for item in items:
            if item is None:
                await self.close()
                self._lost(NotificationsLost("the notification connection was lost"))
                return
            self.row_changed = self.row_changed or item[0] == self.job_channel

    async def close(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            await subscription.close()
