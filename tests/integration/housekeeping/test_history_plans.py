"""Queries that ran over a tenant's whole history read what is live only (issue 49 item 2).

With 1M rows of history, each query reads at most twice the buffers it reads with 1k
(EXPLAIN (ANALYZE, BUFFERS) of the statement the code sends, captured as it runs). The history is
what months of a service leave: finished jobs whose audio expired and whose text was blanked, and the
last days' jobs still holding theirs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.integration.housekeeping.conftest import Clock, copy_rows
from webapp.speech import lifecycle
from webapp.speech.models import SynthesisJob

SMALL = 1_000
# `make bench` (tests/bench/bench_history.py) runs this module with 10M rows, and asks for the figures
# in a file (TTS_HISTORY_REPORT).
LARGE = int(os.environ.get("TTS_HISTORY_ROWS", 1_000_000))
REPORT = os.environ.get("TTS_HISTORY_REPORT")
TABLE = SynthesisJob._meta.db_table
SLACK_PAGES = 8


def _add_history(template: SynthesisJob, n: int) -> None:
    """``n`` copies of a finished job's row under new ids: nine in ten finished over the past years,
    their audio expired and their text blanked; one in ten succeeded in the last days, holding their
    audio (within the plans' retention), no client waiting for them. Their text is blank too: kept
    texts are live rows, whose index deepens as they grow; the history is what this is about."""
    recent = n // 10
    for count, status, text, audio_bytes, spacing in (
        (n - recent, "'expired'", "''", "0", "interval '1 minute'"),
        (recent, "'succeeded'", "''", "1000", "interval '1 second'"),
    ):
        copy_rows(
            SynthesisJob,
            template.id,
            count,
            {
                "id": "gen_random_uuid()",
                "status": status,
                "text": text,
                "audio_path": "''",
                "audio_bytes": audio_bytes,
                "waiter_until": "NULL",
                "finished_at": f"statement_timestamp() - n * {spacing}",
                "created_at": f"statement_timestamp() - n * {spacing}",
            },
        )


def _statements() -> list[str]:
    """The job-table reads of the reaper's lapsed waiters and of text retention, as the code sends them."""
    with CaptureQueriesContext(connection) as queries:
        lifecycle.abandon_lapsed_waiters()
        lifecycle.blank_old_texts()
    found = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and f'"{TABLE}"' in q["sql"]
    ]
    assert len(found) >= 2, found
    return found


def _report(test: str, figures: list[tuple[str, int, int]]) -> None:
    """Buffers read at 1k and at LARGE rows of history, per statement, for the bench's table."""
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as out:
            for sql, at_1k, at_1m in figures:
                out.write(
                    json.dumps(
                        {"test": test, "rows": LARGE, "sql": sql[:160], "small": at_1k, "large": at_1m}
                    )
                )
                out.write("\n")


def _buffers(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_the_reaper_and_text_retention_read_the_same_with_1m_rows_of_history_as_with_1k(
    clock: Clock, org: Any, lock_free: None
) -> None:
    from webapp.tenants.models import Organization

    # Other tenants on the same plan (the full suite leaves hundreds): joined to them, PostgreSQL
    # walked the whole index of kept texts in tenant order (2 -> 968 buffers).
    Organization.objects.bulk_create(
        Organization(name=f"Other {n}", slug=f"other-{org.slug}-{n}", plan=org.plan) for n in range(300)
    )
    long_ago = clock.now - dt.timedelta(days=400)
    template = SynthesisJob.objects.create(
        organization=org,
        voice_name="v",
        engine="espeak",
        text="",
        text_chars=10,
        format="wav",
        status="expired",
        created_at=long_ago,
        finished_at=long_ago,
    )
    # What is live beside the history: a client being handed its answer, a running job with a
    # waiter, texts still within retention.
    for status in ("succeeded", "running"):
        SynthesisJob.objects.create(
            organization=org,
            voice_name="v",
            engine="espeak",
            text="Live.",
            text_chars=5,
            format="wav",
            status=status,
            claim_token=1,
            attempts=1,
            finished_at=clock.now if status == "succeeded" else None,
            waiter_until=clock.now + dt.timedelta(minutes=1),
        )
    _add_history(template, SMALL)
    statements = _statements()
    small = [_buffers(sql) for sql in statements]

    _add_history(template, LARGE - SMALL)
    assert SynthesisJob.objects.count() >= LARGE
    large = [_buffers(sql) for sql in statements]

    tenants = Organization.objects.count()
    _report("reaper and text retention", list(zip(statements, small, large, strict=True)))
    for sql, at_1k, at_1m in zip(statements, small, large, strict=True):
        # Twice, and a few pages more: with a handful of rows read, an index a level deeper or a
        # heap page not yet all-visible doubles the count; reading the history is thousands.
        # Text retention probes each tenant's range of kept texts: a page a tenant, whichever plan
        # PostgreSQL picked for the small table (the full suite's statistics gave another).
        assert at_1m <= 2 * at_1k + SLACK_PAGES + tenants, (at_1k, at_1m, sql)


def _add_billed_history(template: SynthesisJob, n: int) -> None:
    """``n`` copies of a billed job, reserved and charged over the past year on two voices: their
    ledger events (two a job) and job rows (expired, the audio gone). The usage kept per day and
    key is then counted from the events, by the ledger's own recount."""
    from webapp.speech.models import UsageDay, UsageEvent
    from webapp.speech.services import ledger
    from webapp.tenants import locks

    batch = uuid.uuid4().hex  # each copy's job key: the same for its reserve and its charge
    when = "(statement_timestamp() - mod(n, 365) * interval '1 day')"
    for event in UsageEvent.objects.filter(job_key=template.id):
        copy_rows(
            UsageEvent,
            event.pk,
            n,
            {
                "id": f"nextval(pg_get_serial_sequence('{UsageEvent._meta.db_table}', 'id'))",
                "job_id": "NULL",
                "job_key": f"md5('{batch}' || n)::uuid",
                "created_at": when,
                "period": f"date_trunc('month', {when} AT TIME ZONE 'UTC')::date",
                "voice_name": "CASE WHEN mod(n, 2) = 0 THEN 'voice-a' ELSE 'voice-b' END",
            },
        )
    copy_rows(
        SynthesisJob,
        template.id,
        n,
        {
            "id": "gen_random_uuid()",
            "status": "'expired'",
            "text": "''",
            "audio_path": "''",
            "audio_bytes": "0",
            "created_at": when,
            "finished_at": when,
        },
    )
    locks.lock_tenant(template.organization_id)
    ledger.recount_rollups(template.organization_id)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {UsageDay._meta.db_table}")


def _usage_statements(org: Any, key: Any, today: dt.date) -> list[str]:
    """What a capped key's submit reads of its month, GET /api/v1/usage, and the usage explorer
    over a year in each grouping, as the code sends them."""
    from webapp.speech.services import ledger
    from webapp.speech.services.ledger import reports

    with CaptureQueriesContext(connection) as queries:
        ledger.check_key_cap(key, 1, ledger.period_start())
        reports.summary(org)
        for group in reports.GROUPS:
            reports.breakdown(org, group, today - dt.timedelta(days=365), today)
    found = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().startswith("SELECT")]
    assert len(found) >= 1 + 4 + len(reports.GROUPS), found
    return found


def test_a_capped_key_s_submit_and_the_usage_reports_read_the_same_with_1m_rows_of_history_as_with_1k(
    clock: Clock, org: Any
) -> None:
    from tests.usage_data import billed_job
    from webapp.tenants.models import Organization
    from webapp.tenants.services import OPERATOR, create_api_key

    # Two tenants on one plan, with a capped key each: one with 1k rows of ledger history, one
    # with 1M (500k billed jobs, a reservation and a charge each, and their job rows).
    busy = Organization.objects.create(name=f"Busy {org.slug}", slug=f"busy-{org.slug}", plan=org.plan)
    measured = []
    for tenant, rows in ((org, SMALL), (busy, LARGE)):
        key, _ = create_api_key(tenant, "capped", created_by=OPERATOR, monthly_characters=10**9)
        template = billed_job(tenant, 10, key=key, voice="voice-a", when=clock.now)
        _add_billed_history(template, rows // 2)
        measured.append((tenant, key))
    small, large = (
        [_buffers(sql) for sql in _usage_statements(tenant, key, clock.now.date())]
        for tenant, key in measured
    )
    statements = _usage_statements(*measured[0], clock.now.date())
    _report("key cap and usage reports", list(zip(statements, small, large, strict=True)))
    for sql, at_1k, at_1m in zip(statements, small, large, strict=True):
        assert at_1m <= 2 * at_1k + SLACK_PAGES, (at_1k, at_1m, sql)
