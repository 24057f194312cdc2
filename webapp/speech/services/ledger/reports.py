"""What the ledger says a tenant used: every read of its charges, for whoever shows usage.

``charges`` is the one read of what a tenant was charged: the usage explorer
(``breakdown``: charged characters over a range of UTC days, grouped by day, key,
voice, source or member; ``GET /api/v1/usage?group_by=``, the dashboard's usage
page and its CSV) reads it; a stream's usage (``job_charge``) reads its job's charge. ``summary``
is the rest of ``GET /api/v1/usage`` and the dashboard's overview: the month's bill
(characters used and reserved), the cache's share, daily totals. (What a key took of its monthly cap:
``ledger.key_characters``, which the submit reads under the tenant lock.)

Read from the ledger alone: the usage per UTC day of the submit, key, member, voice and
source (``UsageDay``), which the ledger keeps with each reservation and settlement, so a
report reads a row per day and group whatever the tenant's history, and the report of a
month equals the bill (``UsagePeriod.characters_used``) even after its jobs are deleted. A
charge counts on the day of its reservation (the submit), as the bill counts it in the
reservation's month.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from webapp.errors import DomainError, ErrorCode
from webapp.speech.models import SynthesisJob, UsageDay, UsageEvent, UsagePeriod
from webapp.speech.services.ledger import period_end, period_start, storage_used
from webapp.tenants.models import ApiKey, Membership, Organization

GROUPS = ("day", "key", "voice", "source", "member")
# The longest range one report covers, in days (from and to both counted).
MAX_RANGE_DAYS = 366
SOURCE_LABELS = {"api": "API", "openai": "OpenAI endpoint", "dashboard": "Dashboard"}

_DAYS = UsageDay._meta.db_table
_GROUP_SQL = {
    "day": "day",
    "key": "api_key_id",
    "voice": "voice_name",
    "source": "source",
    "member": "user_id",
}


@dataclass(frozen=True)
class Row:
    group: str  # the value grouped by: an ISO day, a key's or member's id, a voice id, a source
    label: str  # what a person reads for it
    characters: int  # charged: what the bill counts
    cached_characters: int  # of the jobs' text, served from the sentence cache (billed at its price)
    jobs: int


@dataclass(frozen=True)
class Report:
    group_by: str
    start: dt.date
    end: dt.date  # inclusive
    rows: list[Row] = field(default_factory=list)

    @property
    def characters(self) -> int:
        return sum(row.characters for row in self.rows)

    @property
    def cached_characters(self) -> int:
        return sum(row.cached_characters for row in self.rows)

    @property
    def jobs(self) -> int:
        return sum(row.jobs for row in self.rows)

    def as_json(self) -> dict[str, Any]:
        return {
            "group_by": self.group_by,
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
            "rows": [row.__dict__ for row in self.rows],
            "total": {
                "characters": self.characters,
                "cached_characters": self.cached_characters,
                "jobs": self.jobs,
            },
        }


def this_month(today: dt.date) -> tuple[dt.date, dt.date]:
    return today.replace(day=1), today


def last_month(today: dt.date) -> tuple[dt.date, dt.date]:
    end = today.replace(day=1) - dt.timedelta(days=1)
    return end.replace(day=1), end


def _bad(message: str, field: str) -> DomainError:
    return DomainError(ErrorCode.INVALID_REQUEST, message, field=field)


def _date(raw: str, name: str) -> dt.date:
    try:
        if len(raw) != 10:
            raise ValueError(raw)
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise _bad(f"{name} must be a date as YYYY-MM-DD (UTC), not {raw[:40]!r}.", name) from None


def parse(
    group_by: str | None, start: str | None, end: str | None, today: dt.date | None = None
) -> tuple[str, dt.date, dt.date]:
    """``group_by``, ``from`` and ``to`` as a request gives them (None: left out), checked.

    Defaults: by day, from the first of this month (UTC) to today. 400
    invalid_request for an unknown grouping, a malformed date, ``from`` after
    ``to``, or a range longer than MAX_RANGE_DAYS.
    """
    today = today or timezone.now().astimezone(dt.UTC).date()
    group = group_by or "day"
    if group not in GROUPS:
        raise _bad(f"group_by must be one of {', '.join(GROUPS)}, not {group[:40]!r}.", "group_by")
    # Left out: to is today (or from, if that is later); from is the first of to's month.
    last = _date(end, "to") if end else None
    first = _date(start, "from") if start else (last or today).replace(day=1)
    if last is None:
        last = max(today, first)
    if first > last:
        raise _bad(f"from ({first}) is after to ({last}).", "from")
    if (last - first).days + 1 > MAX_RANGE_DAYS:
        raise _bad(f"The range is {(last - first).days + 1} days; at most {MAX_RANGE_DAYS} at once.", "to")
    return group, first, last


def charges(
    organization_id: Any, start: dt.date, end: dt.date, group_by: str | None = None
) -> dict[str, tuple[int, int, int]]:
    """The one read of what a tenant was charged: per group, (characters charged, characters served
    from the sentence cache, jobs charged), over the jobs submitted from ``start`` to ``end`` (UTC
    days, both included). ``group_by`` one of GROUPS; None: one total, under "".

    Read from the usage kept per day (``UsageDay``, written with each reservation and
    settlement): one row per day and key, member, voice and source, however many jobs.
    """
    expr = _GROUP_SQL[group_by] if group_by is not None else "NULL"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
        SELECT {expr} AS grp, sum(characters), sum(cached_characters), sum(charged_jobs)
        FROM {_DAYS}
        WHERE organization_id = %(org)s AND day BETWEEN %(start)s AND %(end)s
        GROUP BY grp HAVING sum(charged_jobs) > 0""",
            {"org": organization_id, "start": start, "end": end},
        )
        found = cursor.fetchall()
    return {_key(group): (int(chars), int(cached), int(jobs)) for group, chars, cached, jobs in found}


def breakdown(organization: Organization, group_by: str, start: dt.date, end: dt.date) -> Report:
    """The tenant's charges reserved from ``start`` to ``end`` (UTC days, both included), grouped."""
    if group_by not in GROUPS:
        raise _bad(f"group_by must be one of {', '.join(GROUPS)}.", "group_by")
    totals = charges(organization.pk, start, end, group_by)
    labels = _labels(organization, group_by, list(totals))
    if group_by == "day":
        days = [start + dt.timedelta(days=n) for n in range((end - start).days + 1)]
        rows = [_row(day.isoformat(), day.isoformat(), totals.get(day.isoformat())) for day in days]
    else:
        rows = [_row(group, labels[group], totals[group]) for group in totals]
        rows.sort(key=lambda row: (-row.characters, row.label))
    return Report(group_by, start, end, rows)


def _key(group: Any) -> str:
    if group is None:
        return ""
    return group.isoformat() if isinstance(group, dt.date) else str(group)


def _row(group: str, label: str, values: tuple[int, int, int] | None) -> Row:
    chars, cached, jobs = values or (0, 0, 0)
    return Row(group, label, chars, cached, jobs)


def _labels(organization: Organization, group_by: str, groups: list[str]) -> dict[str, str]:
    if group_by == "key":
        keys = {
            str(pk): f"{name} (tts_{prefix}_…)"
            for pk, name, prefix in ApiKey.objects.filter(pk__in=[g for g in groups if g]).values_list(
                "pk", "name", "prefix"
            )
        }
        return {g: keys.get(g, "deleted key") if g else "no key (dashboard)" for g in groups}
    if group_by == "member":
        # Members now only: a user who left keeps an account, and the address they use today is
        # not the tenant's to read.
        members = Membership.objects.filter(
            organization=organization, user_id__in=[int(g) for g in groups if g]
        )
        emails = {str(pk): email for pk, email in members.values_list("user_id", "user__email")}
        return {g: emails.get(g, "former member") if g else "no member" for g in groups}
    if group_by == "source":
        return {g: SOURCE_LABELS.get(g, g or "unknown") for g in groups}
    return {g: g or "unknown" for g in groups}


def job_charge(job_id: Any) -> int:
    """What the job's settlement charged (0 for a release, or while it is not settled): a stream's usage."""
    charge = UsageEvent.objects.filter(job_key=job_id, kind=UsageEvent.Kind.CHARGE).first()
    return charge.characters if charge is not None else 0


def job_reserved(job_id: Any) -> int:
    """What the job reserved: what a whole answer is charged, known before the answer is sent."""
    reserve = UsageEvent.objects.filter(job_key=job_id, kind=UsageEvent.Kind.RESERVE).first()
    return reserve.characters if reserve is not None else 0


def speech_usage(characters: int) -> dict[str, Any]:
    """vLLM-Omni's usage object for characters charged: a character is this service's token."""
    return {
        "input_tokens": characters,
        "output_tokens": 0,
        "total_tokens": characters,
        "input_token_details": {"text_tokens": characters, "audio_tokens": 0},
    }


def speech_usage_headers(characters: int) -> dict[str, str]:
    """vLLM-Omni's usage headers of a whole (not streamed) answer."""
    return {
        "X-VLLM-OMNI-INPUT-TOKENS": str(characters),
        "X-VLLM-OMNI-OUTPUT-TOKENS": "0",
        "X-VLLM-OMNI-TOTAL-TOKENS": str(characters),
        "X-VLLM-OMNI-INPUT-TEXT-TOKENS": str(characters),
        "X-VLLM-OMNI-INPUT-AUDIO-TOKENS": "0",
    }


Status = SynthesisJob.Status


def summary(organization: Organization, now: dt.datetime | None = None, days: int = 31) -> dict[str, Any]:
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
    """(cached, fresh) characters charged for the tenant's jobs submitted in the month ``period`` starts:
    served from the sentence cache, and rendered whole."""
    row = UsageDay.objects.filter(
        organization=organization, day__gte=period, day__lt=period_end_date(period)
    ).aggregate(cached=Sum("cached_characters"), fresh=Sum("fresh_characters"))
    return int(row["cached"] or 0), int(row["fresh"] or 0)


def period_end_date(period: dt.date) -> dt.date:
    """The first day of the month after the one ``period`` starts."""
    return period_end(dt.datetime.combine(period, dt.time(0), tzinfo=dt.UTC)).date()


def daily_totals(organization: Organization, now: dt.datetime, days: int) -> list[dict[str, Any]]:
    """Per UTC day of the submit (oldest first, days with none left out): characters charged,
    reserved and given back, and jobs submitted."""
    since = (now - dt.timedelta(days=days - 1)).astimezone(dt.UTC).date()
    rows = (
        UsageDay.objects.filter(organization=organization, day__gte=since)
        .values("day")
        .annotate(
            charged=Sum("characters"), reserved=Sum("reserved"), released=Sum("released"), jobs=Sum("jobs")
        )
        .order_by("day")
    )
    return [
        {
            "date": row["day"].isoformat(),
            "charged": int(row["charged"]),
            "reserved": int(row["reserved"]),
            "released": int(row["released"]),
            "jobs": int(row["jobs"]),
        }
        for row in rows
    ]
