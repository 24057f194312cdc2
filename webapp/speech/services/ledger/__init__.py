"""Usage ledger: periods, plan limits, and reserve / charge / release.

A job's characters are reserved at submit (same transaction as the job), then
exactly one of charge (success) or release (failure, cancel, expiry). The
``UsageEvent`` unique constraint on (job, kind) makes a second charge or
release impossible, whatever retries or redeliveries happen.

The functions here are steps, not actions: they run inside the transaction of
the job transition that calls them (``webapp.speech.lifecycle``). The ledger owns
every rule of money: callers state what happened (``settle_completion``,
``settle_delivery``, ``release``) and the charge's parts, prices and quota levels
are built in ``_charges``, which nothing outside this package imports.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from webapp.errors import DomainError, ErrorCode
from webapp.rawrows import fetch_one
from webapp.speech.models import (
    ACTIVE_STATUSES,
    LIVE_JOBS_SQL,
    JobStatus,
    KeyUsage,
    SynthesisJob,
    UsageDay,
    UsageEvent,
    UsagePeriod,
    Voice,
    sql_status_in,
)
from webapp.speech.services.ledger import _charges
from webapp.tenants import locks
from webapp.tenants.models import ApiKey, Organization, Plan

# --------------------------------------------------------------------- periods


def period_start(when: dt.datetime | None = None) -> dt.date:
    """Usage periods are calendar months in UTC, derived from dates: no reset job."""
    when = (when or timezone.now()).astimezone(dt.UTC)
    return dt.date(when.year, when.month, 1)


def period_end(when: dt.datetime | None = None) -> dt.datetime:
    start = period_start(when)
    if start.month == 12:
        return dt.datetime(start.year + 1, 1, 1, tzinfo=dt.UTC)
    return dt.datetime(start.year, start.month + 1, 1, tzinfo=dt.UTC)


def seconds_to_period_end(when: dt.datetime | None = None) -> int:
    when = when or timezone.now()
    return max(1, int((period_end(when) - when).total_seconds()) + 1)


def format_count(n: int) -> str:
    return f"{n:,}"


def storage_used(organization: Organization) -> int:
    """Bytes a tenant stores: job audio and word timestamps, voice prompts and its sentence cache (as a
    submit's limits count them)."""
    row = fetch_one(f"SELECT {_STORED_BYTES} FROM {_JOBS} WHERE {_LIVE_OF_TENANT}", {"org": organization.pk})
    assert row is not None  # an aggregate answers one row
    return int(row[0]) + int(row[1]) + int(organization.sentence_cache_used)


# --------------------------------------------------------------------- limits and reservation


def check_limits(organization: Organization, chars: int, now: dt.datetime, engine: str) -> dt.date:
    """Request size, concurrency, storage, monthly quota and the engine's queue room.

    Returns the period to reserve in. The caller holds the tenant row's lock,
    which every writer of the tenant's usage rows takes first (the reservation
    below, settlements, tenant deletion): the usage row read here cannot change
    before ``reserve_usage`` updates it, nor appear between the read and its
    creation. The engine's queue depth is a limit, not a count to the job, and
    is read without a lock.
    """
    plan = organization.plan
    if chars > plan.max_characters_per_request:
        raise DomainError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"{format_count(chars)} characters in one request; your plan allows "
            f"{format_count(plan.max_characters_per_request)}.",
            field="text",
        )
    period = period_start(now)
    queue_limit = settings.TTS_MAX_QUEUED_JOBS_PER_ENGINE
    # Everything below in one statement: it was five, each a round trip and a queryset to compile.
    row = fetch_one(
        _LIMITS,
        {"org": organization.pk, "period": period, "engine": engine, "queue_limit": max(queue_limit, 0)},
    )
    assert row is not None  # an aggregate answers one row
    active, job_bytes, prompt_bytes, period_chars, queued = row
    if active >= plan.max_concurrent_jobs:
        raise DomainError(
            ErrorCode.CONCURRENCY_LIMIT,
            f"{active} of {plan.max_concurrent_jobs} concurrent jobs are queued or running; "
            "wait for one to finish.",
            retry_after=5,
        )
    # storage_used, read in the same statement (the sentence cache's bytes are on the locked tenant row)
    used_bytes = int(job_bytes) + int(prompt_bytes) + int(organization.sentence_cache_used)
    if used_bytes >= plan.storage_bytes:
        raise DomainError(
            ErrorCode.STORAGE_LIMIT,
            f"{format_count(used_bytes)} of {format_count(plan.storage_bytes)} bytes of storage are in use; "
            "delete old jobs or voices, or wait for audio to expire.",
            retry_after=3600,
        )
    if period_chars is None:  # the tenant's first job this month
        UsagePeriod.objects.create(organization_id=organization.pk, period=period)
        period_chars = 0
    total = period_chars + chars
    if total > plan.monthly_characters:
        raise DomainError(
            ErrorCode.QUOTA_EXCEEDED,
            f"{format_count(total)} of {format_count(plan.monthly_characters)} characters this month "
            f"({format_count(period_chars)} used or reserved, {format_count(chars)} requested).",
            retry_after=seconds_to_period_end(now),
        )
    if queue_limit > 0 and queued >= queue_limit:
        raise DomainError(
            ErrorCode.QUEUE_FULL,
            f"The {engine} queue is full ({queue_limit} jobs waiting); try again later.",
            retry_after=QUEUE_FULL_RETRY_SECONDS,
        )
    return period


def reserve_usage(job: SynthesisJob, period: dt.date) -> None:
    """Reserve the job's characters in ``period``: its event and the usage row's total, in one statement.

    A key with monthly characters of its own (``ApiKey.monthly_characters``) is
    checked first, under the tenant row's lock as the plan's quota is: refused
    ``key_quota_exceeded``, the submit's transaction (the job row too) is undone.
    """
    key = job.api_key if job.api_key_id is not None else None
    if key is not None and key.monthly_characters is not None:
        check_key_cap(key, job.text_chars, period)
    with connection.cursor() as cursor:
        cursor.execute(
            _RESERVE,
            {
                "org": job.organization_id,
                "job": job.id,
                "chars": job.text_chars,
                "period": period,
                # The job's creation is its submit: the day its usage counts on.
                "now": job.created_at,
                "key": job.api_key_id,
                "user": job.user_id,
                "voice": job.voice_name,
                "source": job.source,
            },
        )


def key_characters(organization_id: Any, period: dt.date, key_id: Any = None) -> dict[Any, int]:
    """Characters each of the tenant's keys (or only ``key_id``) took in the month ``period``
    starts: charged when settled, reserved until then. A capped key's submit reads its own under
    the tenant lock; the members page reads them all. One row a key (``KeyUsage``)."""
    rows = KeyUsage.objects.filter(api_key__organization_id=organization_id, period=period)
    if key_id is not None:
        rows = rows.filter(api_key_id=key_id)
    return {key: int(n) for key, n in rows.values_list("api_key_id", "characters")}


def recount_rollups(organization_id: Any) -> tuple[int, int]:
    """Recount the tenant's ``UsageDay`` and ``KeyUsage`` rows from its ledger events.

    A step: the caller holds the tenant row's lock (every writer of them takes it first). For
    what kept rows can miss: reservations made by a version that did not keep them (a rolling
    upgrade), a restore of the events alone. Returns (day rows, key rows) written.
    """
    params = {"org": organization_id}
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {_USAGE_DAYS} WHERE organization_id = %(org)s", params)
        cursor.execute(_RECOUNT_DAYS, params)
        days = cursor.rowcount
        cursor.execute(
            f"DELETE FROM {_KEY_USAGE} WHERE api_key_id IN "
            f"(SELECT id FROM {ApiKey._meta.db_table} WHERE organization_id = %(org)s)",
            params,
        )
        cursor.execute(_RECOUNT_KEYS, params)
        return days, cursor.rowcount


def check_key_cap(key: ApiKey, chars: int, period: dt.date) -> None:
    cap = key.monthly_characters
    if cap is None:
        return
    taken = key_characters(key.organization_id, period, key.pk).get(key.pk, 0)
    if taken + chars > cap:
        raise DomainError(
            ErrorCode.KEY_QUOTA_EXCEEDED,
            f"{format_count(taken + chars)} of this key's {format_count(cap)} characters this month "
            f"({format_count(taken)} used or reserved, {format_count(chars)} requested).",
            retry_after=seconds_to_period_end(),
        )


# What a refused submission is told to wait (queue_full).
QUEUE_FULL_RETRY_SECONDS = 30

_JOBS, _VOICES, _PERIODS = SynthesisJob._meta.db_table, Voice._meta.db_table, UsagePeriod._meta.db_table
_KEY_USAGE, _USAGE_DAYS = KeyUsage._meta.db_table, UsageDay._meta.db_table
_DAY_COLUMNS = (
    "organization_id, day, api_key_id, user_id, voice_name, source, "
    "jobs, reserved, charged_jobs, characters, cached_characters, fresh_characters, released"
)
# The job rows' condition is LIVE_JOBS, as the partial index speech_job_org_stored_idx has it, so
# the count and sum read only the tenant's live jobs (tests/integration/api/test_quotas.py).
_LIVE_OF_TENANT = f"organization_id = %(org)s AND {LIVE_JOBS_SQL}"
# What a tenant stores, over its live job rows: their audio and word timestamps, and its voices' prompts.
_STORED_BYTES = f"""coalesce(sum(audio_bytes + timestamps_bytes), 0),
    (SELECT coalesce(sum(prompt_bytes), 0) FROM {_VOICES} WHERE organization_id = %(org)s)"""
_LIMITS = f"""
    SELECT count(*) FILTER (WHERE {sql_status_in(ACTIVE_STATUSES)}), {_STORED_BYTES},
        (SELECT characters_used + characters_reserved FROM {_PERIODS}
         WHERE organization_id = %(org)s AND period = %(period)s),
        (SELECT count(*) FROM (
            SELECT 1 FROM {_JOBS} WHERE {sql_status_in((JobStatus.QUEUED,))} AND engine = %(engine)s
            LIMIT %(queue_limit)s
        ) AS waiting)
    FROM {_JOBS} WHERE {_LIVE_OF_TENANT}"""
# A reservation with its settlement, if any (the recounts below).
_SETTLED = f"""{UsageEvent._meta.db_table} r
    LEFT JOIN {UsageEvent._meta.db_table} s ON s.job_key = r.job_key AND s.kind <> '{UsageEvent.Kind.RESERVE}'
    WHERE r.organization_id = %(org)s AND r.kind = '{UsageEvent.Kind.RESERVE}'"""
_CHARGE = f"s.kind = '{UsageEvent.Kind.CHARGE}'"
_RECOUNT_DAYS = f"""
    INSERT INTO {_USAGE_DAYS} ({_DAY_COLUMNS})
    SELECT r.organization_id, (r.created_at AT TIME ZONE 'UTC')::date, r.api_key_id, r.user_id,
        r.voice_name, r.source, count(*), sum(r.characters),
        count(*) FILTER (WHERE {_CHARGE}),
        coalesce(sum(s.characters) FILTER (WHERE {_CHARGE}), 0),
        coalesce(sum((SELECT sum((p->>'covers')::bigint) FROM jsonb_array_elements(s.parts) p
                      WHERE p->>'kind' = '{_charges.PartKind.CACHED}')), 0),
        coalesce(sum((SELECT sum((p->>'characters')::bigint) FROM jsonb_array_elements(s.parts) p
                      WHERE p->>'kind' = '{_charges.PartKind.FRESH}')), 0),
        coalesce(sum(GREATEST(0, r.characters - s.characters)), 0)
    FROM {_SETTLED}
    GROUP BY 1, 2, 3, 4, 5, 6"""
_RECOUNT_KEYS = f"""
    INSERT INTO {_KEY_USAGE} (api_key_id, period, characters)
    SELECT r.api_key_id, r.period, sum(coalesce(s.characters, r.characters))
    FROM {_SETTLED} AND r.api_key_id IS NOT NULL
    GROUP BY 1, 2"""
_RESERVE = f"""
    WITH event AS (
        INSERT INTO {UsageEvent._meta.db_table}
            (organization_id, job_id, job_key, kind, characters, parts, period, created_at,
             api_key_id, user_id, voice_name, source)
        VALUES (%(org)s, %(job)s, %(job)s, '{UsageEvent.Kind.RESERVE}', %(chars)s, '[]', %(period)s, %(now)s,
                %(key)s, %(user)s, %(voice)s, %(source)s)
    ), key_month AS (
        INSERT INTO {_KEY_USAGE} AS k (api_key_id, period, characters)
        SELECT %(key)s::uuid, %(period)s, %(chars)s WHERE %(key)s::uuid IS NOT NULL
        ON CONFLICT ON CONSTRAINT one_key_usage_row DO UPDATE SET characters = k.characters + EXCLUDED.characters
    ), day AS (
        INSERT INTO {_USAGE_DAYS} AS d ({_DAY_COLUMNS})
        VALUES (%(org)s, (%(now)s::timestamptz AT TIME ZONE 'UTC')::date, %(key)s::uuid, %(user)s::bigint,
                %(voice)s, %(source)s, 1, %(chars)s, 0, 0, 0, 0, 0)
        ON CONFLICT ON CONSTRAINT one_usage_day_row DO UPDATE
        SET jobs = d.jobs + 1, reserved = d.reserved + EXCLUDED.reserved
    )
    UPDATE {_PERIODS} SET characters_reserved = characters_reserved + %(chars)s
    WHERE organization_id = %(org)s AND period = %(period)s"""


@dataclass(frozen=True)
class Settlement:
    """What one settlement did: the characters charged (0: released) and the month it counted in.

    ``used`` and ``monthly`` are the month's characters after it and the plan's allowance;
    ``levels`` the quota levels (percent) this settlement crossed, each crossed once a month
    (the owners' e-mail and the usage.threshold event both read them).
    """

    organization_id: Any
    charged: int
    period: dt.date
    used: int
    monthly: int
    levels: tuple[int, ...] = ()

    @property
    def resets(self) -> dt.datetime:
        return period_end(dt.datetime.combine(self.period, dt.time(0), tzinfo=dt.UTC))


def settle_completion(
    job_id: Any, duration_seconds: float, *, characters: int = 0, cached: int = 0, cached_price: float = 1.0
) -> Settlement | None:
    """A job that delivered its whole audio: its characters (``cached`` of them from the sentence
    cache, at ``cached_price``), and audio past the bound per character by its seconds."""
    return _settle(job_id, _charges.completion(duration_seconds, cached, characters, cached_price))


def settle_delivery(job_id: Any, characters: int, seconds: float) -> Settlement | None:
    """A job that ended before its whole audio was handed (canceled, deleted, its client gone):
    what its streams handed to clients, nothing for the rest."""
    return _settle(job_id, _charges.delivery(characters, seconds))


def release(job_id: Any) -> Settlement | None:
    """A job that ends charging nothing: its whole reservation back."""
    return _settle(job_id, ())


@dataclass(frozen=True)
class Handed:
    """What one client was handed of a job's audio, as its transport (an HTTP stream, a socket) counted it.

    ``pcm_bytes``: bytes of the attempt's 16-bit mono PCM the transport handed on, at
    ``sample_rate``; ``sentences``: (end byte, characters of the text) of each sentence
    written so far; ``text_chars``: the text's characters the sentences share out;
    ``billable_chars``: the job's billable characters (0: the text's).
    """

    pcm_bytes: int
    sample_rate: int
    sentences: Sequence[tuple[int, int]]
    text_chars: int
    billable_chars: int = 0


def delivered(handed: Handed) -> tuple[int, float]:
    """(billable characters, audio seconds) a client was handed, as a delivery charges them.

    A sentence counts once all of its audio was handed; its characters are the job's
    billable ones in the sentence's share of the text; the seconds are the PCM handed.
    """
    if not handed.text_chars:
        return 0, 0.0
    heard = sum(chars for end, chars in handed.sentences if end <= handed.pcm_bytes)
    billable = handed.billable_chars or handed.text_chars
    chars = min(billable, math.ceil(billable * heard / handed.text_chars))
    seconds = handed.pcm_bytes / 2 / handed.sample_rate if handed.sample_rate else 0.0
    return chars, seconds


def highest_level(percent: float) -> int:
    """The highest quota level (percent of the month) that ``percent`` reaches; 0: none."""
    return _charges.highest_level(percent)


def _settle(job_id: Any, parts: Iterable[_charges.Part]) -> Settlement | None:
    """Settle the job's reservation exactly once: charge ``parts``, give the rest back.

    The one settlement of a job, whichever way it ended (the lifecycle calls one
    of the functions above inside the transition's transaction). No parts, or none
    with characters: a release. The event records the parts; what they add up to
    is capped by the reservation, except audio past the bound per character, which
    may take the tenant past its monthly quota: its next submit is then refused.
    Returns None if the job was settled already (or never reserved).
    """
    # The job's ledger in one read: its reservation (tenant, characters, period, and the day, key,
    # member, voice and source its usage counts under), and whether it is settled already. The job
    # row is not needed: a settlement works from its ledger.
    events = list(
        UsageEvent.objects.filter(job_key=job_id).values_list(
            "kind",
            "organization_id",
            "characters",
            "period",
            "created_at",
            "api_key_id",
            "user_id",
            "voice_name",
            "source",
        )
    )
    reserve = next((e[1:] for e in events if e[0] == UsageEvent.Kind.RESERVE), None)
    if reserve is None or any(e[0] != UsageEvent.Kind.RESERVE for e in events):
        return None
    organization_id, reserved, period, reserved_at, key_id, user_id, voice_name, source = reserve
    charged, recorded = _charges.tally(reserved, parts)
    kind = UsageEvent.Kind.CHARGE if charged else UsageEvent.Kind.RELEASE
    # The tenant row before the usage row, as every other transaction locks them; only the
    # lock is needed here, not the row.
    locks.hold_tenant(organization_id)
    with connection.cursor() as cursor:
        # The event, unless one of its kind exists (the unique constraint on job and kind):
        # in one statement, where a savepoint around an INSERT took three.
        cursor.execute(
            _SETTLE,
            [organization_id, job_id, job_id, kind, charged, json.dumps(recorded), period, timezone.now()],
        )
        if cursor.fetchone() is None:
            return None
    # The tenant row is locked: the usage row (there since the reservation, gone only with its
    # tenant) is updated, and locked, in one statement, which also marks a quota level reached,
    # and counts the settlement in the key's month and the reservation's day.
    row = fetch_one(
        _SETTLE_PERIOD,
        {
            "org": organization_id,
            "period": period,
            "reserved": reserved,
            "charged": charged,
            "day": reserved_at.astimezone(dt.UTC).date(),
            "key": key_id,
            "user": user_id,
            "voice": voice_name,
            "source": source,
            "charged_jobs": 1 if charged else 0,
            "cached": sum(p.get("covers", 0) for p in recorded if p["kind"] == _charges.PartKind.CACHED),
            "fresh": sum(p["characters"] for p in recorded if p["kind"] == _charges.PartKind.FRESH),
            "released": max(0, reserved - charged),
        },
    )
    if row is None:
        return Settlement(organization_id, charged, period, 0, 0)
    after, before, used, monthly = (int(v) for v in row)
    return Settlement(organization_id, charged, period, used, monthly, _charges.levels_crossed(before, after))


# What a settlement counts in the key's month and in the reservation's day. Upserts, not updates:
# a reservation made before these rows were kept (a rolling upgrade) has none, and its settlement
# still counts (``manage.py recount_usage`` recounts what such a window missed).
_SETTLE_ROLLUPS = f"""
    key_month AS (
        INSERT INTO {_KEY_USAGE} AS k (api_key_id, period, characters)
        SELECT %(key)s::uuid, %(period)s, %(charged)s WHERE %(key)s::uuid IS NOT NULL
        ON CONFLICT ON CONSTRAINT one_key_usage_row
        DO UPDATE SET characters = GREATEST(0, k.characters - %(reserved)s + EXCLUDED.characters)
    ), day AS (
        INSERT INTO {_USAGE_DAYS} AS d ({_DAY_COLUMNS})
        VALUES (%(org)s, %(day)s, %(key)s::uuid, %(user)s::bigint, %(voice)s, %(source)s,
                0, 0, %(charged_jobs)s, %(charged)s, %(cached)s, %(fresh)s, %(released)s)
        ON CONFLICT ON CONSTRAINT one_usage_day_row DO UPDATE SET
            charged_jobs = d.charged_jobs + EXCLUDED.charged_jobs,
            characters = d.characters + EXCLUDED.characters,
            cached_characters = d.cached_characters + EXCLUDED.cached_characters,
            fresh_characters = d.fresh_characters + EXCLUDED.fresh_characters,
            released = d.released + EXCLUDED.released
    )"""
# A level is marked in ``quota_level_announced`` by the settlement that reaches it: each is
# announced once a month (under the tenant row's lock, whatever settles at once).
_SETTLE_PERIOD = f"""
    WITH {_SETTLE_ROLLUPS}
    UPDATE {_PERIODS} u SET
        characters_reserved = u.characters_reserved - %(reserved)s,
        characters_used = u.characters_used + %(charged)s,
        quota_level_announced = GREATEST(
            u.quota_level_announced,
            CASE WHEN %(charged)s = 0 OR p.monthly_characters <= 0 THEN 0 {_charges.LEVEL_AFTER_SQL} ELSE 0 END
        )
    FROM {Organization._meta.db_table} o JOIN {Plan._meta.db_table} p ON p.id = o.plan_id,
        (SELECT quota_level_announced AS level FROM {_PERIODS}
         WHERE organization_id = %(org)s AND period = %(period)s) AS before
    WHERE u.organization_id = %(org)s AND u.period = %(period)s AND o.id = u.organization_id
    RETURNING u.quota_level_announced, before.level, u.characters_used, p.monthly_characters"""


# The settlement's key, member, voice and source are its reservation's (the job may be gone).
_SETTLE = f"""
    INSERT INTO {UsageEvent._meta.db_table}
        (organization_id, job_id, job_key, kind, characters, parts, period, created_at,
         api_key_id, user_id, voice_name, source)
    SELECT v.*, r.api_key_id, r.user_id, r.voice_name, r.source
    FROM (VALUES (%s::uuid, %s::uuid, %s::uuid, %s, %s::integer, %s::jsonb, %s::date, %s::timestamptz)) AS v
    LEFT JOIN {UsageEvent._meta.db_table} r ON r.job_key = v.column3 AND r.kind = '{UsageEvent.Kind.RESERVE}'
    ON CONFLICT (job_key, kind) DO NOTHING RETURNING id"""
