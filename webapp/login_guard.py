"""Failed log-ins: a lockout per (user name, address) and a slow-down per user name.

django-axes counts failures per pair (``AXES_LOCKOUT_PARAMETERS``): after
``TTS_LOGIN_FAILURE_LIMIT`` of them that address may not try that user name
for ``TTS_LOGIN_LOCKOUT_MINUTES``. Nobody can lock anyone else out that way:
the same user name from another address is checked as usual.

Against guessing one user name from many addresses, a slow-down on the user
name: once its failures from all addresses in the lockout window reach
``TTS_LOGIN_SLOWDOWN_AFTER``, each further failure makes the next attempt wait
a delay that doubles (1 s, 2 s, 4 s, … up to ``TTS_LOGIN_SLOWDOWN_MAX_SECONDS``),
counted from the user name's last failure. The slow-down never sleeps (a web
worker is never held) and never refuses the right password from an address
that has not failed for that user name: such an attempt is always checked
(and a wrong one counts). An attempt from an address that *has* failed for the
user name, before the delay has passed, is answered ``429`` with
``Retry-After`` without looking at the password. So a guesser gets one guess
per fresh address, and a used address one per delay, while the account's
owner signs in from an address of their own at any time (docs/decisions.md).

The counts are django-axes' own rows (``AccessAttempt``), read in one query.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Max, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from webapp.client_ip import client_ip

# The first delay of the slow-down; each further failure doubles it.
SLOWDOWN_BASE_SECONDS = 1.0


def _window_start(now: dt.datetime) -> dt.datetime:
    """Failures older than the lockout's cool-off count for nothing (as for django-axes)."""
    return now - dt.timedelta(hours=float(settings.AXES_COOLOFF_TIME))


def slowdown_delay(failures: int) -> float:
    """Seconds the user name's next attempt waits after its last failure, given its failures in the window."""
    after = int(settings.TTS_LOGIN_SLOWDOWN_AFTER)
    if failures < after:
        return 0.0
    # min() first: 2 ** a large count must not be computed as a float overflow.
    doublings = min(failures - after, 62)
    return float(min(SLOWDOWN_BASE_SECONDS * 2**doublings, settings.TTS_LOGIN_SLOWDOWN_MAX_SECONDS))


def slowdown_wait(request: HttpRequest, username: str | None, now: dt.datetime | None = None) -> int | None:
    """Whole seconds this attempt must wait before its password is checked; None: check it now."""
    if not username:
        return None
    now = now or timezone.now()
    ip = client_ip(request)
    found = AccessAttempt.objects.filter(username=username, attempt_time__gte=_window_start(now)).aggregate(
        total=Sum("failures_since_start"),
        here=Sum("failures_since_start", filter=Q(ip_address=ip)),
        last=Max("attempt_time"),
    )
    if not found["here"] or found["last"] is None:
        return None  # an address that has not failed for this user name is always heard
    ready = found["last"] + dt.timedelta(seconds=slowdown_delay(int(found["total"] or 0)))
    left = (ready - now).total_seconds()
    return math.ceil(left) if left > 0 else None


def _lockout_left(request: HttpRequest, username: str | None, now: dt.datetime) -> int:
    """Seconds until the pair's lockout ends: the cool-off after its last counted failure."""
    last = (
        AccessAttempt.objects.filter(username=username, ip_address=client_ip(request))
        .aggregate(last=Max("attempt_time"))
        .get("last")
    )
    cool_off = dt.timedelta(hours=float(settings.AXES_COOLOFF_TIME))
    end = (last or now) + cool_off
    return max(1, math.ceil((end - now).total_seconds()))


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """django-axes' answer to a refused log-in (``AXES_LOCKOUT_CALLABLE``): 429 with Retry-After."""
    waited = getattr(request, "login_retry_after", None)
    if waited is not None:
        seconds = int(waited)
        text = (
            "Too many failed log-ins for this account; from this address, try again in "
            f"{seconds} s. Signing in from an address that has not failed is not delayed."
        )
    else:
        username = (credentials or {}).get("username")
        seconds = _lockout_left(request, username, timezone.now())
        text = f"Too many failed log-ins for this account from this address; try again in {seconds} s."
    response = HttpResponse(text, status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(seconds)
    response["Cache-Control"] = "no-store"
    return response
