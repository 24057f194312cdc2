"""Hourly budgets of the account actions that send mail or add people, counted in Redis.

Sign-ups per client address, invitations per inviter and per tenant, and the
account mails (password reset, address confirmation, invitations) per
recipient and per client address. Each budget is a counter in Django's cache
(Redis, so every web process on every node sees one count) for the current
clock hour, like the sign-up throttle always was. These are writes: when Redis
cannot count, the action is refused (the caller says "try again later"), as the
request rates refuse writes (webapp/tenants/ratelimit.py).
"""

from __future__ import annotations

import logging
import time

from django.core.cache import cache
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

WINDOW_SECONDS = 3600


def spend(budgets: list[tuple[str, int]]) -> bool:
    """Count one action against each ``(bucket, limit)`` of this hour, in order; False when one is spent.

    Counting stops at the first spent budget: an inviter past their own
    budget does not use up the tenant's (list the narrower budget first).
    """
    window = int(time.time() // WINDOW_SECONDS)
    try:
        for bucket, limit in budgets:
            key = f"hourly:{bucket}:{window}"
            cache.add(key, 0, timeout=WINDOW_SECONDS)
            if int(cache.incr(key)) > limit:
                return False
    except (RedisError, OSError, ValueError) as exc:  # ValueError: the key went between add and incr
        log.warning("hourly budget not counted, refusing: %s", exc)
        return False
    return True
