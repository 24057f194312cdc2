"""Per-key (and per signed-in user) request rates from the tenant's plan.

django-ratelimit counts in the shared Redis cache in fixed windows of one
minute, keyed by the API key id (or user id), so every gunicorn worker on
every node sees one counter and two keys of one tenant never share a budget.
Responses carry the IETF httpapi ratelimit-headers draft fields::

    RateLimit-Policy: "minute";q=60;w=60
    RateLimit: "minute";r=12;t=31

A Redis outage fails open (no limit, no headers): the database stays the
truth for quotas, and reading a job must not need the cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django_ratelimit.core import get_usage
from redis.exceptions import RedisError

from webapp.problems import Problem
from webapp.tenants.models import ApiKey

log = logging.getLogger(__name__)

POLICY = "minute"
WINDOW_SECONDS = 60
GROUP = "api"


@dataclass(frozen=True)
class RateUsage:
    limit: int
    remaining: int
    reset: int
    exceeded: bool

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Policy": f'"{POLICY}";q={self.limit};w={WINDOW_SECONDS}',
            "RateLimit": f'"{POLICY}";r={self.remaining};t={self.reset}',
        }


def principal_key(request: Any) -> str | None:
    """``key:<id>`` for an API key, ``user:<id>`` for a signed-in user, else None."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiKey):
        return f"key:{auth.pk}"
    user = getattr(request, "user", None)
    if (
        user is not None
        and getattr(user, "is_authenticated", False)
        and isinstance(getattr(user, "pk", None), int)
    ):
        return f"user:{user.pk}"
    return None


def check_rate(request: Any, organization: Any) -> RateUsage | None:
    """Count this request; raise a 429 Problem when over the plan's rate. None when not limited."""
    if not settings.TTS_RATELIMIT_ENABLED or organization is None:
        return None
    principal = principal_key(request)
    if principal is None:
        return None
    limit = int(organization.plan.requests_per_minute)
    try:
        usage = get_usage(
            request,
            group=GROUP,
            key=lambda _group, _request: principal,
            rate=f"{limit}/m",
            increment=True,
        )
    except (RedisError, ConnectionError, OSError) as exc:
        log.warning("rate limit check skipped, cache unavailable: %s", exc)
        return None
    if usage is None:
        return None
    count = int(usage["count"])
    reset = max(1, int(usage["time_left"]))
    result = RateUsage(
        limit=limit, remaining=max(0, limit - count), reset=reset, exceeded=bool(usage["should_limit"])
    )
    if result.exceeded:
        problem = Problem(
            429,
            "rate_limited",
            f"More than {limit:,} requests in a minute with this credential; try again in {reset} s.",
            retry_after=reset,
        )
        problem.extra_headers = result.headers()
        raise problem
    return result
