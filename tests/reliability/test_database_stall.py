"""A PostgreSQL stall does not make a busy worker fail its liveness probe (issue 49, item 3).

The watchdog reads the rows of the jobs running in its child; a session holding an ACCESS
EXCLUSIVE lock on their table (a migration, a stuck transaction) blocks that read. The
child's probe file must keep being rewritten meanwhile (Kubernetes would otherwise restart
the pod and each running job would lose an attempt), and the watchdog's read gives up
within its own timeout rather than waiting for as long as the lock is held.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from tests.reliability.helpers import children, flush_queues, job, make_org, start_worker, submit, wait_until
from tests.stack import CFG, TestStack
from webapp.speech.runtime import probe

pytestmark = pytest.mark.django_db(transaction=True)

STALL_SECONDS = 7.0
WATCHDOG_TIMEOUT = 2  # TTS_WATCHDOG_QUERY_TIMEOUT of the test's worker, below the stall
MAX_AGE = 2.0  # the probe's --max-age here: four heartbeats of 0.5 s


def _probe_file(pid: int) -> Path:
    folder = Path(settings.TTS_WORKER_PROBE_DIR)
    for path in folder.glob("worker-*.alive"):
        try:
            if int(path.read_text().split()[1]) == pid:
                return path
        except (FileNotFoundError, IndexError, ValueError):
            continue
    raise AssertionError(f"no probe file of child {pid} in {folder}")


def _blocked_watchdog_queries(conn: psycopg.Connection[Any]) -> list[Any]:
    """The start times of the watchdog's reads now waiting for a lock (this test's worker is the only one)."""
    from webapp.speech.models import SynthesisJob

    select = str(SynthesisJob.objects.values_list("id", "claim_token").query).split(" FROM ")[0]
    rows = conn.execute(
        "SELECT query_start FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        [select + "%"],
    ).fetchall()
    return [r[0] for r in rows]


def test_a_database_stall_does_not_stop_the_liveness_file(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.espeak")
    marker = "#stall-hang#"
    worker = start_worker(
        stack,
        "w-stall",
        TTS_FAULT_HANG_MARKER=marker,
        TTS_WATCHDOG_QUERY_TIMEOUT=str(WATCHDOG_TIMEOUT),
    )
    try:
        busy = submit(make_org("stall"), f"This text {marker} keeps its worker busy.")
        row = wait_until(lambda: (r := job(busy.id)).status == "running" and r, 30, "the job to start")
        pid = int(row.worker.rpartition(":")[2])
        assert pid in {p.pid for p in children(worker)}
        path = _probe_file(pid)
        node = path.name[len("worker-") : path.name.rindex("-")]
        assert probe.check("live", path.parent, MAX_AGE, node)[0]
        with (
            psycopg.connect(CFG.database_url) as locker,
            psycopg.connect(CFG.database_url, autocommit=True) as observer,
        ):
            locker.execute("LOCK TABLE speech_synthesisjob IN ACCESS EXCLUSIVE MODE")
            blocked_since: set[Any] = set()
            verdicts: list[tuple[float, bool, str]] = []
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < STALL_SECONDS:
                passed, why = probe.check("live", path.parent, MAX_AGE, node)
                verdicts.append((round(elapsed, 2), passed, why))
                blocked_since.update(_blocked_watchdog_queries(observer))
                time.sleep(0.25)
            locker.rollback()
        # The stall overlapped the watchdog: its read of this child's job waited on the lock ...
        assert blocked_since, "the watchdog's query was never seen waiting for the lock"
        # The liveness file kept being rewritten all along.
        assert [v for v in verdicts if not v[1]] == [], verdicts
        # The watchdog's read gave up within its timeout, then asked again (a read per attempt, each bounded).
        assert len(blocked_since) >= 2, blocked_since
        assert job(busy.id).status == "running"  # nothing of this ended the job
        assert pid in {p.pid for p in children(worker)}
    finally:
        stack.stop_service(worker)
