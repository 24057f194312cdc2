"""Read models for the views and the admin: what a tenant sees of its usage and voices."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from webapp.rawrows import columns, fetch_one
from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod, Voice
from webapp.speech.services.ledger import period_end, period_start, storage_used
from webapp.tenants.models import Organization

Status = SynthesisJob.Status


def usage_summary(
    organization: Organization, now: dt.datetime | None = None, days: int = 31
) -> dict[str, Any]:
    """What GET /api/v1/usage shows: plan, current period, characters, jobs, storage, daily totals."""
    now = now or timezone.now()
    plan = organization.plan
    period = period_start(now)
    row = UsagePeriod.objects.filter(organization=organization, period=period).first()
    used = row.characters_used if row else 0
    reserved = row.characters_reserved if row else 0
    counts = {
        s: n
        for s, n in SynthesisJob.objects.filter(organization=organization, status__in=SynthesisJob.ACTIVE)
        .values_list("status")
        .annotate(n=Count("id"))
    }
    plan_fields = (
        "slug",
        "name",
        "monthly_characters",
        "max_characters_per_request",
        "max_concurrent_jobs",
        "max_concurrent_waits",
        "requests_per_minute",
        "max_voices",
        "retention_days",
        "text_retention_days",
        "storage_bytes",
        "sentence_cache_bytes",
        "cached_character_price",
    )
    cached = cached_characters(organization, period)
    return {
        "plan": {name: getattr(plan, name) for name in plan_fields},
        "period": {"start": period_start(now), "end": period_end(now)},
        "characters": {
            "used": used,
            "reserved": reserved,
            "limit": plan.monthly_characters,
            "remaining": max(0, plan.monthly_characters - used - reserved),
        },
        # Of the characters of the jobs that succeeded this period: served from the sentence cache
        # (billed at the plan's cached_character_price), and rendered; and the cache's bytes.
        "sentence_cache": {
            "cached_characters": cached[0],
            "fresh_characters": cached[1],
            "used_bytes": int(organization.sentence_cache_used),
            "limit_bytes": int(plan.sentence_cache_bytes),
        },
        "jobs": {
            "queued": counts.get(Status.QUEUED, 0),
            "running": counts.get(Status.RUNNING, 0),
            "limit": plan.max_concurrent_jobs,
        },
        "storage": {"used_bytes": storage_used(organization), "limit_bytes": plan.storage_bytes},
        "daily": daily_totals(organization, now, days),
    }


def cached_characters(organization: Organization, period: dt.date) -> tuple[int, int]:
    """(cached, fresh) characters of the tenant's jobs that succeeded in the period starting ``period``."""
    since = dt.datetime.combine(period, dt.time(0), tzinfo=dt.UTC)
    row = SynthesisJob.objects.filter(
        organization=organization,
        status__in=(Status.SUCCEEDED, Status.EXPIRED),
        finished_at__gte=since,
    ).aggregate(cached=Sum("cached_characters"), total=Sum("text_chars"))
    cached, total = int(row["cached"] or 0), int(row["total"] or 0)
    return cached, max(0, total - cached)


def daily_totals(organization: Organization, now: dt.datetime, days: int) -> list[dict[str, Any]]:
    """Characters charged, reserved and released, and jobs created, per UTC day (oldest first)."""
    since = dt.datetime.combine(
        (now - dt.timedelta(days=days - 1)).astimezone(dt.UTC).date(), dt.time(0), tzinfo=dt.UTC
    )
    daily: dict[str, dict[str, int]] = {}

    def day_entry(day: dt.date) -> dict[str, int]:
        return daily.setdefault(day.isoformat(), {"charged": 0, "reserved": 0, "released": 0, "jobs": 0})

    column = {UsageEvent.Kind.CHARGE: "charged", UsageEvent.Kind.RESERVE: "reserved"}
    for day, kind, chars in (
        UsageEvent.objects.filter(organization=organization, created_at__gte=since)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values_list("day", "kind")
        .annotate(n=Sum("characters"))
        .order_by("day")
    ):
        day_entry(day)[column.get(kind, "released")] += chars
    for day, n in (
        SynthesisJob.objects.filter(organization=organization, created_at__gte=since)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values_list("day")
        .annotate(n=Count("id"))
    ):
        day_entry(day)["jobs"] = n
    return [{"date": day, **values} for day, values in sorted(daily.items())]


def visible_voices(organization: Organization) -> Any:
    """Voices a tenant may use: the built-in ones and its own, ready ones only."""
    return Voice.objects.filter(
        Q(organization__isnull=True) | Q(organization=organization), status=Voice.Status.READY
    )


def job_row(job_id: Any, organization_id: Any = None) -> SynthesisJob | None:
    """The job with this id (of this tenant, if given), or None.

    Every job GET, long-poll answer and download reads it, some more than once:
    written once (webapp/rawrows.py), it costs about 1 ms of CPU less per read
    than ``SynthesisJob.objects.get`` (tests/bench/bench_queries.py).
    """
    j = columns(SynthesisJob, "j")
    if organization_id is None:
        row = fetch_one(f"SELECT {j.sql} FROM {j.table} WHERE j.id = %s", [job_id])
    else:
        row = fetch_one(
            f"SELECT {j.sql} FROM {j.table} WHERE j.id = %s AND j.organization_id = %s",
            [job_id, organization_id],
        )
    return None if row is None else j.build(row)


def visible_voice(organization: Organization, voice_id: str) -> Voice | None:
    """The voice ``voice_id`` if the tenant may use it (``visible_voices``' rule), else None.

    Voice ids are unique across tenants and built-ins, so the row is read by its
    id alone and the tenant's part of the rule checked on it. Every submit runs
    this: written once (webapp/rawrows.py), it costs 1.3 ms of CPU less than
    ``visible_voices(...).get`` (tests/bench/bench_queries.py); both forms select
    the same voices (tests/integration/api/test_read_rules.py).
    """
    v = columns(Voice, "v")
    row = fetch_one(
        f"SELECT {v.sql} FROM {v.table} WHERE v.voice_id = %s AND v.status = %s",
        [voice_id, Voice.Status.READY.value],
    )
    voice: Voice | None = None if row is None else v.build(row)
    return voice if voice is not None and voice.organization_id in (None, organization.pk) else None
