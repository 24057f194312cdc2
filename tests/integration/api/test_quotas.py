"""Monthly characters and concurrency under real parallel submits (PostgreSQL row locks)."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from tests.integration.api.conftest import ApiClient, problem
from webapp.errors import JobFailureCode

TEN_CHARS = "abcdefghij"


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected fault: the broker 'is down', so accepted jobs stay queued (beat would re-send them).

    Keeps the real worker from finishing jobs mid-test, which would free
    concurrency slots and make the counts depend on timing.
    """
    from webapp.speech.services import dispatch

    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)


def _parallel_submits(raw_key: str, n: int, text: str) -> list[Any]:
    barrier = threading.Barrier(n)
    responses: list[Any] = [None] * n

    def submit(i: int) -> None:
        try:
            client = ApiClient(raw_key)
            barrier.wait()
            responses[i] = client.post("/api/v1/speech", {"text": text})
        finally:
            connection.close()  # each thread had its own connection

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return responses


@pytest.mark.usefixtures("no_dispatch")
def test_fifty_parallel_submits_with_room_for_seven(live_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod

    t = live_tenant(monthly_characters=75, max_concurrent_jobs=100)
    responses = _parallel_submits(t.raw_key, 50, TEN_CHARS)
    codes = Counter(r.status_code for r in responses)
    assert codes == {202: 7, 429: 43}, codes
    rejected = [r for r in responses if r.status_code == 429]
    assert {problem(r)["code"] for r in rejected} == {"quota_exceeded"}
    assert all(int(r["Retry-After"]) > 0 for r in rejected)
    assert "80 of 75 characters this month" in problem(rejected[0])["detail"]
    row = UsagePeriod.objects.get(organization=t.org)
    assert (
        row.characters_reserved
        == 70
        == sum(j.text_chars for j in SynthesisJob.objects.filter(organization=t.org))
    )
    assert UsageEvent.objects.filter(organization=t.org, kind="reserve").count() == 7


@pytest.mark.usefixtures("no_dispatch")
def test_concurrency_limit_holds_under_parallel_submits(live_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant(max_concurrent_jobs=3)
    responses = _parallel_submits(t.raw_key, 20, TEN_CHARS)
    codes = Counter(r.status_code for r in responses)
    assert codes == {202: 3, 429: 17}, codes
    rejected = [r for r in responses if r.status_code == 429]
    assert {problem(r)["code"] for r in rejected} == {"concurrency_limit"}
    assert all(0 < int(r["Retry-After"]) <= 10 for r in rejected)
    assert "3 of 3 concurrent jobs" in problem(rejected[0])["detail"]
    assert SynthesisJob.objects.filter(organization=t.org, status="queued").count() == 3


@pytest.mark.usefixtures("synth_worker", "builtin_voices")
def test_failed_and_canceled_jobs_give_characters_back(make_tenant: Any) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import UsageEvent, UsagePeriod

    t = make_tenant(monthly_characters=25)
    first = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()
    second = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()
    assert t.client.post("/api/v1/speech", {"text": TEN_CHARS}).status_code == 429
    lifecycle.fail_job(first["id"], JobFailureCode.SYNTHESIS_FAILED, "boom")
    t.client.post(f"/api/v1/speech/{second['id']}/cancel")
    row = UsagePeriod.objects.get(organization=t.org)
    assert (row.characters_used, row.characters_reserved) == (0, 0)
    assert UsageEvent.objects.filter(organization=t.org, kind="release").count() == 2
    assert t.client.post("/api/v1/speech", {"text": TEN_CHARS}).status_code == 202


@pytest.mark.usefixtures("synth_worker", "builtin_voices")
def test_redelivered_job_is_charged_once(make_tenant: Any) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod
    from webapp.speech.services import ledger

    t = make_tenant()
    job_id = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()["id"]
    claimed = lifecycle.claim_job(job_id, "w1")
    assert claimed is not None
    assert lifecycle.claim_job(job_id, "w2") is None  # the duplicate message finds nothing to claim
    done: dict[str, Any] = {
        "audio_path": "audio/x.wav",
        "audio_bytes": 10,
        "duration_seconds": 1.0,
        "metrics": {},
        "applied_instructions": {},
    }
    assert lifecycle.complete_job(job_id, claimed.claim_token, **done) is True
    assert lifecycle.complete_job(job_id, claimed.claim_token, **done) is False
    assert ledger.settle_completion(SynthesisJob.objects.get(id=job_id).id, 1.0) is None
    assert ledger.release(SynthesisJob.objects.get(id=job_id).id) is None
    row = UsagePeriod.objects.get(organization=t.org)
    assert (row.characters_used, row.characters_reserved) == (10, 0)
    assert UsageEvent.objects.filter(job_key=job_id, kind="charge").count() == 1


@pytest.mark.usefixtures("synth_worker", "builtin_voices")
def test_last_months_usage_does_not_count_this_month(
    make_tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.utils import timezone

    from webapp.speech import lifecycle
    from webapp.speech.models import UsagePeriod
    from webapp.speech.services import ledger

    t = make_tenant(monthly_characters=15)
    real_now = timezone.now()
    last_month = ledger.period_start(real_now) - dt.timedelta(days=3)
    monkeypatch.setattr(timezone, "now", lambda: dt.datetime.combine(last_month, dt.time(12), tzinfo=dt.UTC))
    job_id = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()["id"]
    claimed = lifecycle.claim_job(job_id, "w1")
    assert claimed is not None
    lifecycle.complete_job(
        job_id,
        claimed.claim_token,
        audio_path="",
        audio_bytes=0,
        duration_seconds=1.0,
        metrics={},
        applied_instructions={},
    )
    full = t.client.post("/api/v1/speech", {"text": TEN_CHARS})
    assert full.status_code == 429 and problem(full)["code"] == "quota_exceeded"
    monkeypatch.undo()
    assert t.client.post("/api/v1/speech", {"text": TEN_CHARS}).status_code == 202
    rows = {
        r.period: (r.characters_used, r.characters_reserved)
        for r in UsagePeriod.objects.filter(organization=t.org)
    }
    assert rows == {last_month.replace(day=1): (10, 0), ledger.period_start(real_now): (0, 10)}
    usage = t.client.get("/api/v1/usage").json()
    assert usage["characters"] == {"used": 0, "reserved": 10, "limit": 15, "remaining": 5}


@pytest.mark.usefixtures("synth_worker", "builtin_voices")
def test_quota_error_says_when_the_period_ends(make_tenant: Any) -> None:
    from webapp.speech.services import ledger

    t = make_tenant(monthly_characters=5)
    response = t.client.post("/api/v1/speech", {"text": TEN_CHARS})
    assert response.status_code == 429
    retry = int(response["Retry-After"])
    assert abs(retry - ledger.seconds_to_period_end()) <= 2
    assert "10 of 5 characters this month" in problem(response)["detail"]


def test_storage_limit_blocks_new_jobs(make_tenant: Any, builtin_voices: Any, synth_worker: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = make_tenant(storage_bytes=100)
    job = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()
    SynthesisJob.objects.filter(id=job["id"]).update(status="succeeded", audio_bytes=150)
    blocked = t.client.post("/api/v1/speech", {"text": TEN_CHARS})
    assert blocked.status_code == 429 and problem(blocked)["code"] == "storage_limit"
    assert "150 of 100 bytes" in problem(blocked)["detail"]


def test_a_job_that_finishes_after_its_caller_gave_up_ends_canceled_and_uncharged(make_tenant: Any) -> None:
    """The OpenAI endpoint's timeout path: abandon (cancel + release), then the worker finishes anyway."""
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod

    t = make_tenant()
    job_id = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()["id"]
    claimed = lifecycle.claim_job(job_id, "w1")
    assert claimed is not None
    lifecycle.abandon_job(SynthesisJob.objects.get(id=job_id))  # the caller's wait ran out
    finished = lifecycle.complete_job(
        job_id,
        claimed.claim_token,
        audio_path=f"audio/{t.org.id}/{job_id}.wav",
        audio_bytes=100,
        duration_seconds=1.0,
        metrics={},
        applied_instructions={},
    )
    assert finished is False  # the worker is told its file is not the job's audio
    job = SynthesisJob.objects.get(id=job_id)
    assert (job.status, job.audio_path, job.audio_bytes) == ("canceled", "", 0)
    kinds = sorted(UsageEvent.objects.filter(job_key=job_id).values_list("kind", flat=True))
    assert kinds == ["release", "reserve"]
    row = UsagePeriod.objects.get(organization=t.org)
    assert (row.characters_reserved, row.characters_used) == (0, 0)


@pytest.mark.usefixtures("synth_worker", "builtin_voices", "no_dispatch")
def test_a_finishing_job_is_published_and_charged_in_five_statements(
    make_tenant: Any, django_assert_max_num_queries: Any
) -> None:
    """The worker's last step sits between the synthesis and the client's answer: it is kept short."""
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, UsagePeriod

    t = make_tenant()
    job_id = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()["id"]
    claimed = lifecycle.claim_job(job_id, "w1")
    assert claimed is not None
    done: dict[str, Any] = {
        "audio_bytes": 100,
        "duration_seconds": 1.0,
        "metrics": {},
        "applied_instructions": {},
    }
    # Lock and update the job (expiry included) in one statement, read its ledger, lock the
    # tenant, insert the charge unless one exists, update the usage row, read what its webhooks
    # need (job, endpoints, the month's usage: one statement; none to write here); the test's
    # transaction makes the outer block a savepoint (two statements more). It took 14 (+2), then 8 (+2).
    with django_assert_max_num_queries(6 + 2):
        assert lifecycle.complete_job(job_id, claimed.claim_token, audio_path="a.wav", **done) is True
    job = SynthesisJob.objects.get(id=job_id)
    assert job.status == "succeeded" and job.finished_at is not None
    assert job.expires_at == job.finished_at + dt.timedelta(days=t.org.plan.retention_days)
    row = UsagePeriod.objects.get(organization=t.org)
    assert (row.characters_reserved, row.characters_used) == (0, 10)


@pytest.mark.usefixtures("synth_worker", "builtin_voices", "no_dispatch")
def test_a_submit_locks_the_tenant_once_and_reads_its_usage_row_once(make_tenant: Any) -> None:
    """The statements between a request and its job's message, counted through the API."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    t = make_tenant()
    t.client.post("/api/v1/speech", {"text": TEN_CHARS})  # the usage row of this month now exists
    with CaptureQueriesContext(connection) as queries:
        assert t.client.post("/api/v1/speech", {"text": TEN_CHARS}).status_code == 202
    statements = [q["sql"].replace('"', "") for q in queries.captured_queries]
    assert sum("FROM tenants_organization" in s and "FOR NO KEY UPDATE" in s for s in statements) == 1
    assert sum("FROM speech_usageperiod" in s for s in statements) == 1
    # 18 once: the tenant locked twice, the usage row read twice, its jobs counted and summed apart.
    # 13 until the limits (live jobs, prompt bytes, usage row, queue room) became one statement
    # and the reservation (event and usage row) another. Now: key, voice, savepoint, tenant,
    # limits, job, reservation, release, ETA; the tenant's default pronunciation dictionary; and
    # the answer's concurrency headers (the tenant's and the key's live jobs, one aggregate).
    assert len(statements) == 11, statements


@pytest.mark.usefixtures("synth_worker", "builtin_voices", "no_dispatch")
def test_a_submits_limits_read_the_tenants_live_jobs_not_its_history(make_tenant: Any) -> None:
    """Job rows are kept for good: the count and sum every submit runs go through an index of
    the active jobs and those holding audio, so they cost what is live, not months of history."""
    from django.test.utils import CaptureQueriesContext

    from webapp.speech.models import LIVE_JOBS, SynthesisJob

    # The index's condition names the active statuses itself (a migration cannot import them).
    assert LIVE_JOBS.children[0] == ("status__in", tuple(SynthesisJob.ACTIVE))
    t = make_tenant(storage_bytes=10_000)
    common = {"organization": t.org, "voice_name": "v", "engine": "espeak", "text": "x", "text_chars": 1}
    history = [SynthesisJob(status="expired", format="wav", **common) for _ in range(4000)]
    live = [
        SynthesisJob(status="succeeded", format="wav", audio_bytes=600, **common),
        SynthesisJob(status="running", format="wav", **common),
    ]
    SynthesisJob.objects.bulk_create(history + live)
    with connection.cursor() as cursor:
        cursor.execute('ANALYZE "speech_synthesisjob"')
    with CaptureQueriesContext(connection) as queries:
        assert t.client.post("/api/v1/speech", {"text": TEN_CHARS}).status_code == 202
    (limits,) = [
        q["sql"]
        for q in queries.captured_queries
        if "coalesce(sum(audio_bytes + timestamps_bytes), 0)" in q["sql"]
    ]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + limits)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "speech_job_org_stored_idx" in plan, plan

    # What the limits see: the stored audio and the active jobs, nothing of the history.
    SynthesisJob.objects.filter(organization=t.org, status="succeeded").update(audio_bytes=10_000)
    blocked = t.client.post("/api/v1/speech", {"text": TEN_CHARS})
    assert (
        problem(blocked)["code"] == "storage_limit" and "10,000 of 10,000 bytes" in problem(blocked)["detail"]
    )


@pytest.mark.usefixtures("synth_worker", "builtin_voices", "no_dispatch")
def test_a_settled_job_is_never_settled_again(make_tenant: Any) -> None:
    from django.db import transaction

    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod
    from webapp.speech.services import ledger

    t = make_tenant()
    job_id = t.client.post("/api/v1/speech", {"text": TEN_CHARS}).json()["id"]
    claimed = lifecycle.claim_job(job_id, "w1")
    assert claimed is not None
    done: dict[str, Any] = {
        "audio_bytes": 100,
        "duration_seconds": 1.0,
        "metrics": {"synth_ms": 5},
        "applied_instructions": {},
    }
    assert lifecycle.complete_job(job_id, claimed.claim_token, audio_path="a.wav", **done) is True
    job = SynthesisJob.objects.get(id=job_id)
    assert job.metrics == {"synth_ms": 5} and job.audio_path == "a.wav" and job.progress == 1.0
    settlements = (
        lambda: ledger.settle_completion(job.id, 1.0),
        lambda: ledger.release(job.id),
        lambda: ledger.settle_delivery(job.id, 3, 0.0),
    )
    for settle in settlements:
        with transaction.atomic():
            assert settle() is None
    kinds = sorted(UsageEvent.objects.filter(job_key=job_id).values_list("kind", "characters"))
    assert kinds == [("charge", 10), ("reserve", 10)]
    row = UsagePeriod.objects.get(organization=t.org)
    assert (row.characters_reserved, row.characters_used) == (0, 10)
    # The same attempt finishing again (a retried commit) changes nothing either.
    assert lifecycle.complete_job(job_id, claimed.claim_token, audio_path="b.wav", **done) is False
    assert SynthesisJob.objects.get(id=job_id).audio_path == "a.wav"
