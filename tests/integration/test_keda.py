"""KEDA's signal (webapp/speech/services/keda.py): the backlog query reads an index, not a long history,
and the role `manage.py keda_sql` prints is made by the cluster's administrator, granted by the app's
role (no superuser), and reads that count and nothing else."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from deploy import provision
from deploy.provision import PG_ADMIN_ROLE, PG_APP_ROLE
from tests.stack import CFG

ROLE = "tts_keda_test"
PASSWORD = "keda-test-password"


def _jobs(org: Any, engine: str, statuses: dict[str, int], lane: str = "batch") -> None:
    from webapp.speech.models import SynthesisJob

    common = {"organization": org, "voice_name": "v", "engine": engine, "text": "x", "text_chars": 1}
    SynthesisJob.objects.bulk_create(
        [
            # Succeeded jobs hold their audio, as within retention: the tenant-limits index
            # (speech_job_org_stored_idx) holds them too, so it is no shortcut to the active rows.
            SynthesisJob(
                status=status,
                format="wav",
                claim_token=1,
                lane=lane,
                audio_bytes=1000 if status == "succeeded" else 0,
                **common,
            )
            for status, n in statuses.items()
            for _ in range(n)
        ]
    )


def test_the_backlog_query_reads_an_index_not_the_long_history(db: None) -> None:
    from webapp.speech.services import keda
    from webapp.tenants.services import create_organization

    org = create_organization("KEDA history")
    _jobs(org, "piper", {"succeeded": 6000, "expired": 3000, "failed": 500, "queued": 7, "running": 2})
    _jobs(org, "espeak", {"queued": 40, "succeeded": 500})
    with connection.cursor() as cursor:
        cursor.execute('ANALYZE "speech_synthesisjob"')
        cursor.execute(keda.backlog_query("piper"))
        assert cursor.fetchone() == (9,)
        cursor.execute("EXPLAIN " + keda.backlog_query("piper"))
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # Its own partial index, or the (status, created_at) one when the planner's statistics say that
    # is as cheap (seen once in a full run): either reads only the active rows, never the history.
    assert "Seq Scan" not in plan and "Index" in plan, plan
    assert keda.INDEX in plan or "speech_synt_status_" in plan, plan


def test_keda_sql_prints_the_role_and_each_queues_query() -> None:
    out = io.StringIO()
    call_command("keda_sql", "--engine", "piper", "--engine", "chatterbox", stdout=out)
    text = out.getvalue()
    assert "CREATE ROLE tts_keda LOGIN PASSWORD :'keda_password'" in text
    assert "GRANT SELECT (engine, status, lane) ON TABLE speech_synthesisjob TO tts_keda;" in text
    assert (
        "-- synth.piper, interactive\n" + "SELECT count(*) FROM speech_synthesisjob WHERE engine = 'piper'"
        in text
    )
    assert "-- synth.chatterbox\nSELECT count(*) FROM speech_synthesisjob WHERE engine = 'chatterbox'" in text
    only = io.StringIO()
    call_command("keda_sql", "--engine", "piper", "--query-only", stdout=only)
    assert only.getvalue().strip() == (
        "SELECT count(*) FROM speech_synthesisjob WHERE engine = 'piper' AND status IN ('queued', 'running')"
    )
    with pytest.raises(Exception, match="not an engine name"):
        call_command("keda_sql", "--engine", "piper'; DROP TABLE x; --", stdout=io.StringIO())


@pytest.fixture
def keda_role() -> Iterator[tuple[str, str]]:
    """(part 1, part 2) of the printed script for a role of this test's own, dropped afterwards."""
    from webapp.speech.services import keda

    admin_part, app_part = keda.role_sql("tts", ROLE).split("-- Part 2", 1)
    try:
        yield admin_part, "-- Part 2" + app_part
    finally:
        drop = f"DROP OWNED BY {ROLE}; DROP ROLE {ROLE};"  # a role is the cluster's, not the test's
        dropped = provision.psql(CFG, PG_ADMIN_ROLE, CFG.pg_admin_password, drop, database="tts")
        assert dropped.returncode == 0 or "does not exist" in dropped.stderr, dropped.stderr


def test_the_role_is_granted_by_the_app_role_and_reads_only_the_count(
    transactional_db: None, keda_role: tuple[str, str]
) -> None:
    from webapp.speech.services import keda
    from webapp.tenants.services import create_organization

    admin_part, app_part = keda_role
    # The app's role cannot create it (no CREATEROLE): that part is the administrator's.
    refused = provision.psql(CFG, PG_APP_ROLE, CFG.pg_password, admin_part, keda_password=PASSWORD)
    assert refused.returncode != 0 and "permission denied" in refused.stderr
    made = provision.psql(CFG, PG_ADMIN_ROLE, CFG.pg_admin_password, admin_part, keda_password=PASSWORD)
    assert made.returncode == 0, made.stderr
    granted = provision.psql(CFG, PG_APP_ROLE, CFG.pg_password, app_part, database="tts")
    assert granted.returncode == 0, granted.stderr

    org = create_organization("KEDA role")
    _jobs(org, "piper", {"queued": 3, "running": 1, "succeeded": 5})
    _jobs(org, "piper", {"running": 1, "succeeded": 2}, lane="interactive")
    # Committed (a transactional test): the role's own connection sees them.
    url = CFG.database_url.replace(f"{PG_APP_ROLE}:{CFG.pg_password}@", f"{ROLE}:{PASSWORD}@")
    with psycopg.connect(url, autocommit=True) as db:
        assert db.execute(keda.backlog_query("piper")).fetchone() == (5,)
        assert db.execute(keda.interactive_query("piper")).fetchone() == (1,)
        for forbidden in (
            "SELECT text FROM speech_synthesisjob LIMIT 1",  # the tenants' texts
            "SELECT count(*) FROM tenants_apikey",  # any other table
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(forbidden)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            db.execute("CREATE TEMP TABLE t (x int)")
