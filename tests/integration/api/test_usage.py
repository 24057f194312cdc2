"""GET /api/v1/usage: plan, period, characters, jobs, storage, per-day totals."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from django.utils import timezone

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")


def _complete(job_id: str, **done: Any) -> None:
    """The job claimed and completed as a worker would, with ``done``'s audio bytes (and cache hits)."""
    from webapp.speech import lifecycle

    claimed = lifecycle.claim_job(job_id, "w1")
    assert claimed is not None
    assert lifecycle.complete_job(
        job_id,
        claimed.claim_token,
        audio_path="a.wav",
        duration_seconds=1.0,
        metrics={},
        applied_instructions={},
        **done,
    )


def test_usage_shows_plan_period_characters_jobs_storage_and_days(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import ledger

    t = make_tenant(monthly_characters=1000, max_concurrent_jobs=7)
    charged = t.client.post("/api/v1/speech", {"text": "Twenty characters!!"}).json()  # 19 billable
    t.client.post("/api/v1/speech", {"text": "abcde"})
    _complete(charged["id"], audio_bytes=4096)
    assert SynthesisJob.objects.get(id=charged["id"]).status == "succeeded"
    usage = t.client.get("/api/v1/usage").json()
    assert usage["plan"]["monthly_characters"] == 1000 and usage["plan"]["max_concurrent_jobs"] == 7
    assert usage["period"]["start"] == ledger.period_start().isoformat()
    assert usage["characters"] == {"used": 19, "reserved": 5, "limit": 1000, "remaining": 976}
    assert usage["jobs"] == {"queued": 1, "running": 0, "limit": 7}
    assert usage["storage"] == {"used_bytes": 4096, "limit_bytes": t.org.plan.storage_bytes}
    today = timezone.now().date().isoformat()
    assert usage["daily"] == [{"date": today, "charged": 19, "reserved": 24, "released": 0, "jobs": 2}]


def test_usage_of_one_tenant_is_not_another_s(make_tenant: Any) -> None:
    a, b = make_tenant(), make_tenant()
    a.client.post("/api/v1/speech", {"text": "Only tenant A."})
    usage = b.client.get("/api/v1/usage").json()
    assert usage["characters"]["reserved"] == 0 and usage["daily"] == []


def test_the_usage_kept_per_day_and_key_is_what_a_recount_of_the_ledger_finds(make_tenant: Any) -> None:
    """What each reservation and settlement adds to the rows the reports read equals what
    `manage.py recount_usage` counts from the events; rows missed during an upgrade come back."""
    from django.core.management import call_command

    from tests.usage_data import billed_job
    from webapp.speech.models import KeyUsage, UsageDay

    t = make_tenant(monthly_characters=10_000)
    yesterday = timezone.now() - dt.timedelta(days=1)
    billed_job(t.org, 12, key=t.key, voice="voice-a", when=yesterday)
    billed_job(t.org, 30, key=t.key, voice="voice-b", source="openai")
    canceled = t.client.post("/api/v1/speech", {"text": "Canceled before it ran."}).json()
    t.client.delete(f"/api/v1/speech/{canceled['id']}")
    cached = t.client.post("/api/v1/speech", {"text": "Half of it came from the cache."}).json()
    _complete(cached["id"], audio_bytes=10, cached_characters=15)
    t.client.post("/api/v1/speech", {"text": "Still queued."})  # reserved, not settled

    def rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        days = UsageDay.objects.filter(organization=t.org).order_by("day", "voice_name", "source")
        keys = KeyUsage.objects.filter(api_key__organization=t.org).order_by("period")
        fields = ("day", "api_key_id", "user_id", "voice_name", "source", "jobs", "reserved")
        sums = ("charged_jobs", "characters", "cached_characters", "fresh_characters", "released")
        return list(days.values_list(*fields, *sums)), list(
            keys.values_list("api_key_id", "period", "characters")
        )

    kept = rows()
    texts = (
        12,
        30,
        len("Canceled before it ran."),
        len("Half of it came from the cache."),
        len("Still queued."),
    )
    assert sum(row[5] for row in kept[0]) == len(texts) and sum(row[6] for row in kept[0]) == sum(texts)
    assert {row[0] for row in kept[1]} == {t.key.pk}
    usage = t.client.get("/api/v1/usage").json()
    assert usage["sentence_cache"]["cached_characters"] == 15
    assert sum(day["released"] for day in usage["daily"]) == len("Canceled before it ran.")
    call_command("recount_usage", tenant=t.org.slug, stdout=io.StringIO())
    assert rows() == kept

    # As if these reservations were made by a version that kept no rows: the recount puts them back.
    UsageDay.objects.filter(organization=t.org).delete()
    KeyUsage.objects.filter(api_key__organization=t.org).delete()
    call_command("recount_usage", tenant=t.org.slug, stdout=io.StringIO())
    assert rows() == kept
