"""The per-tenant cap on concurrent waits (long-polls and /v1/audio/speech), counted in Redis.

One sorted set per tenant holds a member per wait in progress, scored by the
time it must be gone by (its wait plus a margin, by Redis's clock). Every
web process counts in the same set, and a member whose process was killed
before it could leave simply ages out: nothing leaks. A plan's
``max_concurrent_waits`` keeps one tenant from holding every connection of
the web tier.

If Redis is away the cap is not counted (the wait itself then falls back to
reading the row once a second): refusing every wait while Redis restarts
would turn a short outage into failed requests for every tenant.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from redis.exceptions import RedisError

from webapp import redis_clients
from webapp.errors import DomainError, ErrorCode
from webapp.tenants.models import Organization

log = logging.getLogger(__name__)

# Past its wait, a member stays this long before it counts as leaked.
MARGIN_SECONDS = 30
RETRY_AFTER_SECONDS = 1

# KEYS[1] the tenant's set; ARGV: cap, lifetime (ms), member. Returns 1 if taken, else 0.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""


def key(organization_id: Any) -> str:
    return f"tts:waits:{organization_id}"


def acquire(organization: Organization, seconds: float) -> str | None:
    """Take one of the tenant's wait slots for ``seconds``; the token to give back, or None if uncounted.

    Raises ``too_many_waits`` (429, Retry-After) when the plan's cap is reached.
    """
    cap = organization.plan.max_concurrent_waits
    token = uuid.uuid4().hex
    lifetime_ms = int((seconds + MARGIN_SECONDS) * 1000)
    try:
        taken = redis_clients.notifications().eval(_ACQUIRE, 1, key(organization.pk), cap, lifetime_ms, token)
    except (RedisError, OSError) as exc:
        log.warning("wait cap not counted (Redis away): %s", exc)
        return None
    if not taken:
        raise DomainError(
            ErrorCode.TOO_MANY_WAITS,
            f"{cap} of {cap} concurrent waits of your plan are in use; retry shortly, or poll without ?wait.",
            retry_after=RETRY_AFTER_SECONDS,
        )
    return token


def release(organization_id: Any, token: str | None) -> None:
    """Give a slot back (a slot not given back ages out after its wait plus the margin)."""
    if token is None:
        return
    try:
        redis_clients.notifications().zrem(key(organization_id), token)
    except (RedisError, OSError) as exc:
        log.warning("wait slot not released (it ages out): %s", exc)


def in_use(organization_id: Any) -> int:
    """Waits counted for the tenant now, expired members included until the next acquire."""
    return int(redis_clients.notifications().zcard(key(organization_id)))
