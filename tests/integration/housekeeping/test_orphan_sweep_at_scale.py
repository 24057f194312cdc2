"""remove_orphan_files at scale: files are looked up by the job id in their name, and a run
that stops at its budget leaves a cursor the next run starts from."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.integration.housekeeping.conftest import Clock, copy_rows, write_file
from webapp.housekeeping.catalog import run_job

JOBS = 200_000


def _age(path: Path, when: dt.datetime) -> None:
    os.utime(path, (when.timestamp(), when.timestamp()))


def test_with_200k_jobs_the_sweep_reads_the_jobs_table_by_index_only(
    clock: Clock, media: Path, make_audio_job: Any, org: Any, lock_free: None
) -> None:
    from webapp.speech.models import SynthesisJob

    old = clock.now - dt.timedelta(seconds=settings.TTS_ORPHAN_GRACE_SECONDS + 60)
    template = make_audio_job(clock.now + dt.timedelta(days=1))
    _age(media / template.audio_path, old)
    # Copies of one real row under new ids, as expired jobs (the bulk of a long history):
    # 200k rows in one statement.
    copy_rows(
        SynthesisJob,
        template.id,
        JOBS,
        {"id": "gen_random_uuid()", "status": "'expired'", "audio_path": "''", "audio_bytes": "0"},
    )
    table = SynthesisJob._meta.db_table
    audio = media / "audio" / str(org.id)
    orphans = [write_file(audio / f"{uuid.uuid4()}.1.wav", 10, mtime=old) for _ in range(20)]

    with CaptureQueriesContext(connection) as queries:
        result = run_job("remove_orphan_files", batch=500)
    assert result.counts.get("removed") == len(orphans), result.counts
    assert (media / template.audio_path).exists()

    on_jobs = [q["sql"] for q in queries.captured_queries if f'"{table}"' in q["sql"]]
    assert on_jobs, "the sweep looked no file up"
    with connection.cursor() as cursor:
        for sql in on_jobs:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert f"Seq Scan on {table}" not in plan, f"{sql[:300]}\n{plan[:600]}"


def test_a_run_that_stops_at_its_budget_is_continued_by_the_next(
    clock: Clock, media: Path, make_audio_job: Any, lock_free: None
) -> None:
    old = clock.now - dt.timedelta(seconds=settings.TTS_ORPHAN_GRACE_SECONDS + 60)
    # First in the walk's order: 30 files jobs reference, which every run must keep.
    for _ in range(30):
        job = make_audio_job(clock.now + dt.timedelta(days=1))
        _age(media / job.audio_path, old)
    # Last: orphans, which a run restarting from the root never reaches with this budget.
    orphans = [write_file(media / "zz" / f"{uuid.uuid4()}.1.wav", 10, mtime=old) for _ in range(10)]

    # A budget of 0: every run handles one batch of 10 files, then stops.
    counts = [run_job("remove_orphan_files", batch=10, budget_seconds=0).counts for _ in range(4)]
    assert [c.get("referenced", 0) for c in counts] == [10, 10, 10, 0], counts
    assert counts[3].get("removed") == 10, counts
    assert not any(o.exists() for o in orphans)

    # The next run finds the end of the walk; the one after starts from the root again.
    assert run_job("remove_orphan_files", batch=10, budget_seconds=0).counts.get("referenced", 0) == 0
    again = run_job("remove_orphan_files", batch=10, budget_seconds=0).counts
    assert again.get("referenced") == 10, again
