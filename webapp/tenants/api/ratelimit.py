"""Request rates that follow the tenant, with IETF RateLimit headers.

The plan's ``requests_per_minute`` is one budget for the whole tenant, shared
by all its keys; a key may also carry a lower rate of its own
(``ApiKey.requests_per_minute``). Both are counted by django-ratelimit in the
shared Redis cache in fixed one-minute windows, so every gunicorn worker on
every node sees one counter. The headers show the limit that binds: the one
exceeded, or else the one with the fewest requests left::

    RateLimit-Policy: "minute";q=60;w=60
    RateLimit: "minute";r=12;t=31

When Redis cannot count, writes fail closed (503 with Retry-After: nothing is
submitted that the limit could not see) and reads go through unlimited and
without headers (reading a job must not need the cache).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django_ratelimit.core import get_usage
from redis.exceptions import RedisError

from webapp.errors import ErrorCode
from webapp.problems import Problem
from webapp.tenants.models import ApiKey, Organization

log = logging.getLogger(__name__)

POLICY = "minute"
WINDOW_SECONDS = 60
GROUP = "api"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# How long a client should wait when the counter is unreachable: about the
# time a Redis restart takes.
UNAVAILABLE_RETRY_AFTER = 5


@dataclass(frozen=True)
class RateUsage:
    limit: int
    remaining: int
    reset: int
    exceeded: bool
    # Whose budget it is: "tenant" or "key".
    scope: str

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Policy": f'"{POLICY}";q={self.limit};w={WINDOW_SECONDS}',
            "RateLimit": f'"{POLICY}";r={self.remaining};t={self.reset}',
        }


def _budgets(request: Any, organization: Organization) -> list[tuple[str, str, int]]:
    """(scope, counter name, limit) for each budget this request draws on; none for anonymous requests."""
    auth = getattr(request, "auth", None)
    user = getattr(request, "user", None)
    if not isinstance(auth, ApiKey) and not getattr(user, "is_authenticated", False):
        return []
    budgets = [("tenant", f"org:{organization.pk}", int(organization.plan.requests_per_minute))]
    if isinstance(auth, ApiKey) and auth.requests_per_minute is not None:
        budgets.append(("key", f"key:{auth.pk}", int(auth.requests_per_minute)))
    return budgets


def _count(request: Any, counter: str, limit: int, scope: str) -> RateUsage:
    usage = get_usage(
        request, group=GROUP, key=lambda _group, _request: counter, rate=f"{limit}/m", increment=True
    )
    if usage is None or int(usage["count"]) < 1:
        # django-ratelimit reports a cache it could not write as count 0 (and time_left -1);
        # a counted request is at least 1. time_left alone also goes negative when the
        # window ends while the cache calls run (a slow request), which is no failure.
        raise RedisError("rate counter not updated")
    count = int(usage["count"])
    return RateUsage(
        limit=limit,
        remaining=max(0, limit - count),
        reset=max(1, int(usage["time_left"])),
        exceeded=bool(usage["should_limit"]),
        scope=scope,
    )


def _binding(usages: list[RateUsage]) -> RateUsage:
    exceeded = [usage for usage in usages if usage.exceeded]
    candidates = exceeded or usages
    return min(candidates, key=lambda usage: (usage.remaining, usage.limit))


def check_rate(request: Any, organization: Organization | None) -> RateUsage | None:
    """Count this request against each budget; a 429 Problem when one is spent. None when not limited."""
    if not settings.TTS_RATELIMIT_ENABLED or organization is None:
        return None
    budgets = _budgets(request, organization)
    if not budgets:
        return None
    try:
        usages = [_count(request, counter, limit, scope) for scope, counter, limit in budgets]
    except (RedisError, ConnectionError, OSError) as exc:
        if request.method in SAFE_METHODS:
            log.warning("rate limit not counted for a read, cache unavailable: %s", exc)
            return None
        log.warning("write refused, rate limit cache unavailable: %s", exc)
        raise Problem(
            503,
            ErrorCode.SERVICE_UNAVAILABLE,
            "The request rate cannot be checked right now; try again shortly.",
            retry_after=UNAVAILABLE_RETRY_AFTER,
        ) from exc
    binding = _binding(usages)
    if binding.exceeded:
        whose = "this tenant" if binding.scope == "tenant" else "this API key"
        problem = Problem(
            429,
            ErrorCode.RATE_LIMITED,
            f"More than {binding.limit:,} requests in a minute for {whose}; try again in {binding.reset} s.",
            retry_after=binding.reset,
        )
        problem.extra_headers = binding.headers()
        raise problem
    return binding
