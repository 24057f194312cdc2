"""Job change notifications: a Redis pub/sub message after every committed state change.

Waiters (long-polls, the OpenAI endpoint) subscribe to their job's channel and
re-read the row only when told, so waiting costs PostgreSQL nothing. A message
carries the job's new status and progress (``"running 0.5"``), so a waiter
decides from it alone whether its wait is over: a burst of waiters woken by one
change does not read the same row once each. A lost message only delays a
waiter to its deadline or its fallback read; the row stays the truth, and every
answer is built from it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from redis.exceptions import RedisError

from webapp import redis_clients

log = logging.getLogger(__name__)


def channel(job_id: Any) -> str:
    return f"tts:job:{job_id}"


def stream_channel(job_id: Any) -> str:
    return f"tts:stream:{job_id}"


def job_changed(job_id: Any, status: str, progress: float) -> None:
    """Publish the job's new state once the current transaction commits (at once in autocommit)."""
    message = f"{status} {float(progress)!r}"
    transaction.on_commit(lambda: _publish(job_id, message))


def parse_state(message: bytes | str) -> tuple[str, float] | None:
    """The (status, progress) a message carries; None for one that carries none."""
    text = message.decode() if isinstance(message, bytes) else message
    status, _, progress = text.partition(" ")
    try:
        return status, float(progress)
    except ValueError:
        return None


def _publish(job_id: Any, message: str) -> None:
    try:
        redis_clients.notifications().publish(channel(job_id), message)
    except (RedisError, OSError) as exc:  # waiters fall back to reading the row once a second
        log.debug("job %s change not published: %s", job_id, exc)


def stream_grew(job_id: Any) -> None:
    """The job's stream file has a new sentence (or its end): published at once, no transaction.

    A channel of its own, so that waiters on the row are not woken per sentence.
    """
    try:
        redis_clients.notifications().publish(stream_channel(job_id), "grew")
    except (RedisError, OSError) as exc:  # streaming readers fall back to looking at the file
        log.debug("job %s stream growth not published: %s", job_id, exc)
