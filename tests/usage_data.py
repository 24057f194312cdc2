"""Charged jobs for the usage tests: a job row and its ledger events, through the ledger's own steps."""

from __future__ import annotations

import datetime as dt
from typing import Any

from tests.dashboard_data import make_job


def billed_job(
    org: Any,
    chars: int,
    *,
    user: Any = None,
    key: Any = None,
    voice: str = "en_US-joe-medium",
    source: str = "api",
    when: dt.datetime | None = None,
) -> Any:
    """A succeeded job of ``chars`` characters, reserved and charged as a real one is (at ``when``)."""
    from django.utils import timezone

    from webapp.speech.models import UsageEvent, UsagePeriod
    from webapp.speech.services import events, ledger

    when = when or timezone.now()
    job = make_job(org, user, text="x" * chars, api_key=key, voice_name=voice, source=source, created_at=when)
    period = ledger.period_start(when)
    UsagePeriod.objects.get_or_create(organization=org, period=period)
    ledger.reserve_usage(job, period)
    settlement = ledger.settle_completion(job.id, 0.0)
    assert settlement is not None
    # As the lifecycle's completion does: the job's end, with its settlement, to the subscribers
    # (the owners' quota e-mail, the webhooks).
    events.publish(events.JobEnded(job.id, "succeeded", settlement))
    UsageEvent.objects.filter(job_key=job.id).update(created_at=when)
    return job
