"""Request rates that follow the tenant, counted by django-ratelimit in DRF's throttle hook.

The plan's ``requests_per_minute`` is one budget for the whole tenant, shared
by all its keys; a key may also carry a lower rate of its own
(``ApiKey.requests_per_minute``). Each is a ``django_ratelimit.core.get_usage``
count (group ``tenant`` keyed by the tenant, group ``key`` keyed by the key)
through Django's cache, in fixed one-minute windows that django-ratelimit
offsets by a hash of the key (``org:<id>``, ``key:<id>``) so the windows of
all tenants do not end at the same second; every gunicorn worker on every node
sees one counter. :class:`TenantRateThrottle` applies it in DRF's
``check_throttles`` (``TenantAPIView.throttle_classes``); the dashboard's
submit, outside DRF, counts through the same :func:`check_rate`. The headers
show the limit that binds: the one exceeded, or else the one with the fewest
requests left::

    RateLimit-Policy: "minute";q=60;w=60
    RateLimit: "minute";r=12;t=31

When Redis cannot count, writes fail closed (503 with Retry-After: nothing is
submitted that the limit could not see) and reads go through unlimited and
without headers (reading a job must not need the cache). The cache backend
(``webapp.redis_clients.RedisCache``, like Django's) raises Redis's errors;
django-ratelimit passes them on, and they are decided here, per method.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django_ratelimit.core import get_usage
from redis.exceptions import RedisError
from rest_framework.throttling import BaseThrottle

from webapp.errors import ErrorCode
from webapp.problems import Problem
from webapp.tenants.models import ApiKey, Organization

log = logging.getLogger(__name__)

POLICY = "minute"
WINDOW_SECONDS = 60
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# How long a client should wait when the counter is unreachable: about the
# time a Redis restart takes.
UNAVAILABLE_RETRY_AFTER = 5


class CountFailed(Exception):
    """django-ratelimit could not read back a count (its key vanished between ``add`` and ``incr``)."""


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

    def problem(self) -> Problem:
        """The 429 of a spent budget, with its RateLimit headers."""
        whose = "this tenant" if self.scope == "tenant" else "this API key"
        problem = Problem(
            429,
            ErrorCode.RATE_LIMITED,
            f"More than {self.limit:,} requests in a minute for {whose}; try again in {self.reset} s.",
            retry_after=self.reset,
        )
        problem.extra_headers = self.headers()
        return problem


def _budgets(request: Any, organization: Organization) -> list[tuple[str, str, int]]:
    """(scope, key, limit) for each budget this request draws on; none for anonymous requests.

    The scope is django-ratelimit's group, the key its key (and so its window's offset)."""
    auth = getattr(request, "auth", None)
    user = getattr(request, "user", None)
    if not isinstance(auth, ApiKey) and not getattr(user, "is_authenticated", False):
        return []
    budgets = [("tenant", f"org:{organization.pk}", int(organization.plan.requests_per_minute))]
    if isinstance(auth, ApiKey) and auth.requests_per_minute is not None:
        budgets.append(("key", f"key:{auth.pk}", int(auth.requests_per_minute)))
    return budgets


def _count(request: Any, scope: str, key: str, limit: int) -> RateUsage | None:
    """This request counted by django-ratelimit; None when django-ratelimit is turned off."""
    for _ in range(2):
        usage = get_usage(
            request, group=scope, key=lambda _group, _request: key, rate=f"{limit}/m", increment=True
        )
        if usage is None:  # RATELIMIT_ENABLE = False
            return None
        if not (usage["limit"] == 0 and usage["time_left"] == -1):  # its "could not count" answer
            count = int(usage["count"])
            return RateUsage(
                limit=limit,
                remaining=max(0, limit - count),
                reset=max(1, int(usage["time_left"])),
                exceeded=bool(usage["should_limit"]),
                scope=scope,
            )
        # The window's key went between django-ratelimit's add and incr (evicted, cleared):
        # counting again starts it afresh.
    raise CountFailed(f"no count for {scope} {key}")


def _binding(usages: list[RateUsage]) -> RateUsage:
    exceeded = [usage for usage in usages if usage.exceeded]
    candidates = exceeded or usages
    return min(candidates, key=lambda usage: (usage.remaining, usage.limit))


def measure(request: Any, organization: Organization | None) -> RateUsage | None:
    """Count this request against each budget: the usage that binds (exceeded or not).

    None when not limited (off, anonymous, or a read while Redis cannot count); a 503
    Problem for a write while Redis cannot count.
    """
    if not settings.TTS_RATELIMIT_ENABLED or organization is None:
        return None
    budgets = _budgets(request, organization)
    if not budgets:
        return None
    try:
        counted = [_count(request, scope, key, limit) for scope, key, limit in budgets]
    except (RedisError, OSError, CountFailed) as exc:
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
    usages = [usage for usage in counted if usage is not None]
    return _binding(usages) if usages else None


def check_rate(request: Any, organization: Organization | None) -> RateUsage | None:
    """Count this request; a 429 Problem when a budget is spent. For callers outside DRF."""
    usage = measure(request, organization)
    if usage is not None and usage.exceeded:
        raise usage.problem()
    return usage


class TenantRateThrottle(BaseThrottle):
    """DRF's throttle hook for the tenant's (and key's) rate.

    The usage that binds is left on the request (``rate_usage``) for the
    response's RateLimit headers (``TenantAPIView.finalize_response``). A spent
    budget raises its 429 Problem here rather than answering False: DRF's own
    ``Throttled`` would say neither whose budget it is nor carry the headers.
    """

    def allow_request(self, request: Any, view: Any) -> bool:
        organization = getattr(request.user, "organization", None)
        request.rate_usage = usage = check_rate(request, organization)
        self.usage = usage
        return True

    def wait(self) -> float | None:
        usage = getattr(self, "usage", None)
        return None if usage is None else float(usage.reset)
