"""Job change notifications: a Redis pub/sub message after every committed state change.

Waiters (long-polls, the OpenAI endpoint) subscribe to their job's channel and
re-read the row only when told, so waiting costs PostgreSQL nothing. A lost
message only delays a waiter to its deadline or its fallback read; the row
stays the truth.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from redis.exceptions import RedisError

from webapp.speech import heartbeat

log = logging.getLogger(__name__)


def channel(job_id: Any) -> str:
    return f"tts:job:{job_id}"


def stream_channel(job_id: Any) -> str:
    return f"tts:stream:{job_id}"


def job_changed(job_id: Any) -> None:
    """Publish once the current transaction commits (at once in autocommit)."""
    transaction.on_commit(lambda: _publish(job_id))


def _publish(job_id: Any) -> None:
    try:
        heartbeat.client().publish(channel(job_id), "changed")
    except (RedisError, OSError) as exc:  # waiters fall back to reading the row once a second
        log.debug("job %s change not published: %s", job_id, exc)


def stream_grew(job_id: Any) -> None:
    """The job's stream file has a new sentence (or its end): published at once, no transaction.

    A channel of its own, so that waiters on the row are not woken per sentence.
    """
    try:
        heartbeat.client().publish(stream_channel(job_id), "grew")
    except (RedisError, OSError) as exc:  # streaming readers fall back to looking at the file
        log.debug("job %s stream growth not published: %s", job_id, exc)
