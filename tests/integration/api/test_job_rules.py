"""Each rule about jobs is written once: the SQL and the Python forms come from one source.

And every way a job ends goes through the lifecycle's one settlement, which records its parts.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from tests.integration.api.direct_jobs import submit_espeak
from webapp.errors import JobFailureCode


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected fault: no message is sent, so the test plays the worker itself."""
    from webapp.speech.services import dispatch

    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)


@pytest.mark.usefixtures("builtin_voices", "no_dispatch")
def test_the_live_jobs_condition_selects_the_same_rows_in_sql_and_in_the_orm(make_tenant: Any) -> None:
    from webapp.speech.models import LIVE_JOBS, LIVE_JOBS_SQL, JobStatus, SynthesisJob

    t = make_tenant()
    for status, audio_bytes in itertools.product(JobStatus, (0, 100)):
        job = submit_espeak(t.org, f"{status} {audio_bytes}")
        SynthesisJob.objects.filter(id=job.id).update(status=status, audio_bytes=audio_bytes)
    ours = SynthesisJob.objects.filter(organization=t.org)
    by_orm = set(ours.filter(LIVE_JOBS).values_list("id", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {SynthesisJob._meta.db_table} WHERE organization_id = %s AND {LIVE_JOBS_SQL}",
            [t.org.id],
        )
        by_sql = {row[0] for row in cursor.fetchall()}
    assert by_orm == by_sql
    # Live: the two active states, and any job holding audio.
    assert len(by_orm) == 2 * 2 + (len(JobStatus) - 2)


def test_sql_status_values_are_the_enums_own() -> None:
    from webapp.speech.models import ACTIVE_STATUSES, LIVE_JOBS, LIVE_JOBS_SQL, sql_status_in

    assert sql_status_in(ACTIVE_STATUSES) == "status IN ('queued', 'running')"
    assert sql_status_in(ACTIVE_STATUSES) in LIVE_JOBS_SQL
    assert ("status__in", ACTIVE_STATUSES) in LIVE_JOBS.children


@pytest.mark.usefixtures("builtin_voices", "no_dispatch")
def test_a_claim_counts_its_deadline_from_the_limit_set_at_submit(make_tenant: Any) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.services.dispatch import job_time_limits

    t = make_tenant()
    with override_settings(TTS_JOB_BASE_SECONDS=7.0, TTS_JOB_SECONDS_PER_CHAR=0.0, TTS_JOB_WALL_FACTOR=2.0):
        job = submit_espeak(t.org, "a short text")
        expected = job_time_limits(job.text_chars)[1]
    assert job.time_limit == dt.timedelta(seconds=expected) == dt.timedelta(seconds=7.0 * 2.0 + 30)
    # The worker's own settings differ from the submitter's: the row decides.
    with override_settings(TTS_JOB_BASE_SECONDS=500.0):
        claimed = lifecycle.claim_job(job.id, "node:ns-1:1")
    assert claimed is not None and claimed.deadline is not None and claimed.started_at is not None
    assert abs((claimed.deadline - claimed.started_at).total_seconds() - expected) < 1.0


@pytest.mark.usefixtures("builtin_voices", "no_dispatch")
def test_every_ending_settles_once_with_its_parts(make_tenant: Any) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import UsageEvent

    t = make_tenant()
    done: dict[str, Any] = {
        "audio_bytes": 10,
        "duration_seconds": 1.0,
        "metrics": {},
        "applied_instructions": {},
    }

    completed = submit_espeak(t.org, "ten chars!")
    claimed = lifecycle.claim_job(completed.id, "node:ns-1:1")
    assert claimed is not None
    assert lifecycle.complete_job(completed.id, claimed.claim_token, audio_path="a.wav", **done)

    streamed = submit_espeak(t.org, "twenty characters!!!")
    assert lifecycle.claim_job(streamed.id, "node:ns-1:2") is not None
    lifecycle.abandon_job(streamed, delivered_chars=8)  # the client heard 8 characters, then left

    failed = submit_espeak(t.org, "fails")
    lifecycle.fail_job(failed.id, JobFailureCode.SYNTHESIS_FAILED, "boom")

    def settlement(job: Any) -> tuple[str, int, list[dict[str, Any]]]:
        event = UsageEvent.objects.exclude(kind=UsageEvent.Kind.RESERVE).get(job_key=job.id)
        return event.kind, event.characters, event.parts

    assert settlement(completed) == ("charge", 10, [{"kind": "fresh", "characters": 10}])
    assert settlement(streamed) == ("charge", 8, [{"kind": "delivered", "characters": 8}])
    assert settlement(failed) == ("release", 0, [])


@pytest.mark.usefixtures("builtin_voices", "no_dispatch")
@pytest.mark.parametrize("fresh", [True, False])
def test_a_stream_of_the_job_its_request_made_leaves_the_new_lease_alone_at_first(
    make_tenant: Any, fresh: bool
) -> None:
    """A renewal at the stream's first step locked the queued row as a worker went to claim it
    (SKIP LOCKED passed over it, and the job waited for the lost-message sweep): a stream of a
    job its own request made starts with the submit's whole lease and renews a period later;
    one of a job made before (an Idempotency-Key replay) renews at once."""
    from webapp.speech.api.streaming import JobStream
    from webapp.speech.models import SynthesisJob

    t = make_tenant()
    job = submit_espeak(t.org)
    past = SynthesisJob.objects.filter(id=job.id)
    past.update(waiter_until=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))  # held, at a value we can see move
    stream = JobStream(job.id, "wav", abandon_on_close=True, start_within=5, fresh_lease=fresh)
    assert stream.step() == b""  # queued: nothing to send yet
    moved = past.values_list("waiter_until", flat=True).get() != dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert moved is not fresh
