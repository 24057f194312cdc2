"""blank_old_texts: a finished job's text goes after its plan's text retention; the row's accounting stays."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.db import connection

from webapp.housekeeping.catalog import run_job
from webapp.speech.models import JobTimestamps, SynthesisJob, UsageEvent
from webapp.speech.services import ledger

DAY = dt.timedelta(days=1)


def _db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now: dt.datetime = cursor.fetchone()[0]
    return now


def _job(org: Any, voice: Any, status: str, finished_ago: dt.timedelta | None, **fields: Any) -> Any:
    now = _db_now()
    return SynthesisJob.objects.create(
        organization=org,
        voice=voice,
        voice_name=voice.voice_id,
        engine=voice.engine,
        text=f"Private words of {status} {uuid.uuid4().hex[:6]}.",
        text_chars=31,
        format="wav",
        source="openai",
        status=status,
        created_at=now - (finished_ago or dt.timedelta()) - dt.timedelta(minutes=1),
        finished_at=None if finished_ago is None else now - finished_ago,
        **fields,
    )


def test_old_texts_are_blanked_and_the_rest_of_the_row_stays(
    org: Any, voice: Any, lock_free: None, monkeypatch: Any
) -> None:
    from webapp.tenants.models import Organization, Plan
    from webapp.tenants.services import OPERATOR, create_api_key

    plan = org.plan
    plan.text_retention_days = 30
    plan.save()
    key, _ = create_api_key(org, "k", created_by=OPERATOR)
    worded = {"speed": 1.2, "instructions": "Whisper my secret plans"}
    said = {"applied": ["speed"], "not_applied": ["unrecognised instruction: 'Whisper my secret plans'"]}
    old = [
        _job(org, voice, status, 31 * DAY, api_key=key, params=worded, applied_instructions=said)
        for status in ("succeeded", "failed", "canceled", "expired")
    ]
    recent = _job(org, voice, "succeeded", 29 * DAY)
    # A running job never loses its text, however old (finished_at of an earlier run is no reason).
    running = _job(org, voice, "running", None, claim_token=1, attempts=1)
    keep_all = Plan.objects.create(slug=f"keep-{uuid.uuid4().hex[:6]}", name="Keep", text_retention_days=None)
    other = Organization.objects.create(name="Keeper", slug=f"keeper-{uuid.uuid4().hex[:6]}", plan=keep_all)
    kept = _job(other, voice, "succeeded", 400 * DAY)
    # Word timestamps spell the text out: they go with it, the recent job's stay.
    spelled = [{"text": "Private", "start": 0.0, "end": 0.4, "char_start": 0, "char_end": 7}]
    for job in (old[0], recent):
        JobTimestamps.objects.create(job=job, words=spelled, sentences=[])
    # Audio kept past the text (a plan may keep audio longer): the timestamps' bytes stop counting.
    SynthesisJob.objects.filter(pk__in=[old[0].pk, recent.pk]).update(audio_bytes=1000, timestamps_bytes=90)
    usage_before = ledger.storage_used(org)
    events_before = UsageEvent.objects.count()

    result = run_job("blank_old_texts", batch=3)  # two batches

    assert result.counts == {"blanked": 4}
    for job in old:
        row = SynthesisJob.objects.get(pk=job.pk)
        assert row.text == ""
        # The instructions are the tenant's words too; the settings that are not words stay.
        assert row.params == {"speed": 1.2} and row.applied_instructions == {}
        # What history and usage need stays, as it was.
        assert (row.status, row.text_chars, row.api_key_id, row.voice_id, row.source) == (
            job.status,
            31,
            key.pk,
            voice.pk,
            "openai",
        )
        assert row.finished_at == job.finished_at
    for job in (recent, running, kept):
        assert SynthesisJob.objects.get(pk=job.pk).text == job.text
    assert list(JobTimestamps.objects.values_list("job_id", flat=True)) == [recent.pk]
    assert ledger.storage_used(org) == usage_before - 90
    assert SynthesisJob.objects.get(pk=recent.pk).timestamps_bytes == 90
    assert UsageEvent.objects.count() == events_before
    # Idempotent: nothing left to do.
    assert run_job("blank_old_texts").counts == {"blanked": 0}
