"""Realtime sessions' rows: opened under the tenant's limits, kept alive by the socket, closed with totals.

A session is one entry in the tenant's history and one webhook (``session.completed``); its units are
jobs (``SynthesisJob.session``) that the job machinery claims, fences, retries and settles like any
other, each charged through the ledger's delivery call by the socket that sent its audio
(webapp/speech/api/session_socket.py). The session's row sums what they were charged at its close.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from webapp.errors import DomainError, ErrorCode
from webapp.speech.models import SpeechSession, SynthesisJob, UsageEvent
from webapp.speech.services import events
from webapp.tenants import locks
from webapp.tenants.models import ApiKey

log = logging.getLogger(__name__)

# How long a session's row counts as open without a renewal from its socket's process. The
# socket renews it every third of this; a process that died leaves it to lapse (close_lapsed).
ALIVE_SECONDS = 30
RETRY_AFTER = 5


def _open_filter() -> Q:
    return Q(status=SpeechSession.Status.OPEN, alive_until__gt=timezone.now())


def open_session(key: ApiKey, protocol: str = "native") -> SpeechSession:
    """A new open session for the key, or 429 ``too_many_sessions`` (per key, then per tenant).

    Counted under the tenant's lock, so two sockets opened at once cannot both take the last place.
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        org = locks.lock_tenant(key.organization_id)
        open_now = SpeechSession.objects.filter(_open_filter(), organization=org)
        per_key = int(settings.TTS_SESSIONS_PER_KEY)
        per_tenant = int(settings.TTS_SESSIONS_PER_TENANT)
        if open_now.filter(api_key=key).count() >= per_key:
            raise DomainError(
                ErrorCode.TOO_MANY_SESSIONS,
                f"This API key has {per_key} realtime sessions open; close one first.",
                retry_after=RETRY_AFTER,
            )
        if open_now.count() >= per_tenant:
            raise DomainError(
                ErrorCode.TOO_MANY_SESSIONS,
                f"This organization has {per_tenant} realtime sessions open; close one first.",
                retry_after=RETRY_AFTER,
            )
        return SpeechSession.objects.create(
            organization=org,
            api_key=key,
            protocol=protocol,
            created_at=now,
            alive_until=now + dt.timedelta(seconds=ALIVE_SECONDS),
        )


def keep_alive(session_id: Any) -> bool:
    """The socket is still open: the row stays open ALIVE_SECONDS more (False: it was closed meanwhile)."""
    until = timezone.now() + dt.timedelta(seconds=ALIVE_SECONDS)
    return bool(
        SpeechSession.objects.filter(id=session_id, status=SpeechSession.Status.OPEN).update(
            alive_until=until
        )
    )


def configured(session_id: Any, voice_name: str, fmt: str) -> None:
    SpeechSession.objects.filter(id=session_id).update(voice_name=voice_name[:200], format=fmt[:10])


@dataclass(frozen=True)
class SessionTotals:
    contexts: int = 0
    units: int = 0
    received_chars: int = 0
    audio_seconds: float = 0.0


def charged(session_id: Any) -> int:
    """What the session's units were charged so far (their settlements' charges)."""
    units = SynthesisJob.objects.filter(session_id=session_id).values("id")
    total = UsageEvent.objects.filter(job_key__in=units, kind=UsageEvent.Kind.CHARGE).aggregate(
        n=Sum("characters")
    )["n"]
    return int(total or 0)


def close_session(session_id: Any, code: int, reason: str, totals: SessionTotals) -> SpeechSession | None:
    """Close the row with its totals and announce it (``session.completed``), once; None if closed already."""
    with transaction.atomic(durable=True):
        session = SpeechSession.objects.select_for_update().filter(id=session_id).first()
        if session is None or session.status != SpeechSession.Status.OPEN:
            return None
        session.status = SpeechSession.Status.CLOSED
        session.close_code = code
        session.close_reason = reason[:200]
        session.contexts = totals.contexts
        session.units = totals.units
        session.received_chars = totals.received_chars
        session.audio_seconds = round(totals.audio_seconds, 3)
        session.charged_chars = charged(session_id)
        session.ended_at = timezone.now()
        session.alive_until = None
        session.save()
        events.publish(events.SessionEnded(session.id, session.organization_id))
    return session


def close_lapsed(limit: int = 500) -> int:
    """Close sessions whose socket's process stopped renewing them (killed with its sockets).

    Their units' waiter leases lapse the same way, and the reaper abandons those (charged for
    what their streams recorded as handed). Run by beat with the other sweeps.
    """
    lapsed = list(
        SpeechSession.objects.filter(
            status=SpeechSession.Status.OPEN, alive_until__lte=timezone.now()
        ).values_list("id", flat=True)[:limit]
    )
    for session_id in lapsed:
        units = SynthesisJob.objects.filter(session_id=session_id)
        totals = SessionTotals(units=units.count())
        close_session(session_id, 1006, "the web process holding the session stopped", totals)
    if lapsed:
        log.warning("closed %d realtime sessions whose web process stopped renewing them", len(lapsed))
    return len(lapsed)


__all__ = [
    "ALIVE_SECONDS",
    "SessionTotals",
    "charged",
    "close_lapsed",
    "close_session",
    "configured",
    "keep_alive",
    "open_session",
]
