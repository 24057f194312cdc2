"""GET /api/v1/usage: plan, period, characters, jobs, storage, per-day totals."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")


def test_usage_shows_plan_period_characters_jobs_storage_and_days(make_tenant: Any) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import ledger

    t = make_tenant(monthly_characters=1000, max_concurrent_jobs=7)
    charged = t.client.post("/api/v1/speech", {"text": "Twenty characters!!"}).json()  # 19 billable
    t.client.post("/api/v1/speech", {"text": "abcde"})
    claimed = lifecycle.claim_job(charged["id"], "w1")
    assert claimed
    lifecycle.complete_job(
        charged["id"],
        claimed.claim_token,
        audio_path="a.wav",
        audio_bytes=4096,
        duration_seconds=1.0,
        metrics={},
        applied_instructions={},
    )
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
