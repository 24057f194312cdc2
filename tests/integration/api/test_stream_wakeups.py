"""A stream waits on its job's notifications (real Redis), and polls only while Redis is away."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from tests.stack import TestStack
from webapp.speech.api.stream_wakeups import (
    POLL_ROW_CHECK_SECONDS,
    POLL_SECONDS,
    SAFETY_SECONDS,
    AsyncWakeups,
    SyncWakeups,
)
from webapp.speech.services import notify


def _later(seconds: float, publish: Any, job_id: Any) -> None:
    threading.Timer(seconds, publish, [job_id]).start()


def _state_changed(job_id: Any) -> None:
    notify._publish(job_id, "running 0.5")  # what job_changed sends once its transaction commits


def test_a_sync_stream_wakes_when_its_file_grows_and_knows_a_state_change(stack: TestStack) -> None:
    job_id = uuid.uuid4()
    wakeups = SyncWakeups(job_id)
    try:
        assert wakeups.pubsub is not None and wakeups.row_check_seconds == SAFETY_SECONDS
        for _ in wakeups.channels:  # the subscription confirmations
            wakeups.pubsub.get_message(timeout=1)
        started = time.monotonic()
        _later(0.3, notify.stream_grew, job_id)
        wakeups.wait()
        assert 0.2 < time.monotonic() - started < SAFETY_SECONDS - 0.5
        assert not wakeups.take_row_changed()
        _later(0.1, _state_changed, job_id)
        wakeups.wait()
        assert wakeups.take_row_changed() and not wakeups.take_row_changed()
    finally:
        wakeups.close()


def test_an_async_stream_wakes_when_its_file_grows_and_knows_a_state_change(stack: TestStack) -> None:
    async def scenario() -> tuple[float, bool, bool]:
        job_id = uuid.uuid4()
        wakeups = await AsyncWakeups(job_id).open()
        try:
            # Both channels confirmed by Redis when open() returns: nothing to drain first.
            assert wakeups.pubsub is not None and wakeups.row_check_seconds == SAFETY_SECONDS
            started = time.monotonic()
            _later(0.3, notify.stream_grew, job_id)
            await wakeups.wait()
            took, grew_changed_row = time.monotonic() - started, wakeups.take_row_changed()
            _later(0.1, _state_changed, job_id)
            await wakeups.wait()
            return took, grew_changed_row, wakeups.take_row_changed()
        finally:
            await wakeups.close()

    took, grew_changed_row, state_changed = asyncio.run(scenario())
    assert 0.2 < took < SAFETY_SECONDS - 0.5
    assert (grew_changed_row, state_changed) == (False, True)


def test_without_redis_a_stream_polls(stack: TestStack, settings: Any) -> None:
    # redis_clients.subscriptions() follows the setting: a pool of its own for this URL.
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    wakeups = SyncWakeups(uuid.uuid4())
    assert wakeups.pubsub is None and wakeups.row_check_seconds == POLL_ROW_CHECK_SECONDS
    # A look at the file every POLL_SECONDS: neither a spin that burns the CPU, nor a block that
    # waits for a notification which cannot come.
    started = time.monotonic()
    for _ in range(10):
        wakeups.wait()
    assert 10 * POLL_SECONDS * 0.9 <= time.monotonic() - started < 10 * POLL_SECONDS + 0.5
    wakeups.close()


def test_async_streams_share_their_loops_one_redis_connection(stack: TestStack) -> None:
    from webapp import redis_clients

    before = {c["id"] for c in redis_clients.notifications().client_list(_type="pubsub")}

    async def scenario() -> tuple[int, list[bool]]:
        job_ids = [uuid.uuid4() for _ in range(5)]
        streams = [await AsyncWakeups(job_id).open() for job_id in job_ids]
        try:
            clients = [
                c for c in redis_clients.notifications().client_list(_type="pubsub") if c["id"] not in before
            ]
            _later(0.1, notify.stream_grew, job_ids[2])
            await streams[2].wait()
            _later(0.1, _state_changed, job_ids[3])
            await streams[3].wait()
            return len(clients), [s.take_row_changed() for s in streams]
        finally:
            for s in streams:
                await s.close()

    connections, row_changed = asyncio.run(scenario())
    assert connections == 1  # five streams, ten channels, one connection (each opened its own before)
    assert row_changed == [False, False, False, True, False]  # only the state change marks the row
