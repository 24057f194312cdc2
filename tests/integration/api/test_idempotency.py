"""Idempotency-Key on POST /api/v1/speech."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.integration.api.conftest import problem

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")


def test_same_key_same_body_returns_the_same_job(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsagePeriod

    t = make_tenant()
    body = {"text": "Only once, please.", "format": "wav"}
    first = t.client.post("/api/v1/speech", body, HTTP_IDEMPOTENCY_KEY="order-42")
    second = t.client.post(
        "/api/v1/speech", {"format": "wav", "text": "Only once, please."}, HTTP_IDEMPOTENCY_KEY="order-42"
    )
    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert second["Location"] == first["Location"]
    assert SynthesisJob.objects.filter(organization=t.org).count() == 1
    assert UsagePeriod.objects.get(organization=t.org).characters_reserved == first.json()["text_chars"]


def test_same_key_different_body_is_422(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = make_tenant()
    t.client.post("/api/v1/speech", {"text": "First."}, HTTP_IDEMPOTENCY_KEY="k1")
    response = t.client.post("/api/v1/speech", {"text": "Second."}, HTTP_IDEMPOTENCY_KEY="k1")
    assert response.status_code == 422
    assert problem(response)["code"] == "idempotency_key_reused"
    assert SynthesisJob.objects.filter(organization=t.org).count() == 1


def test_keys_are_per_tenant_and_expire_after_24h(make_tenant: Any) -> None:
    from webapp.speech.models import IdempotencyKey, SynthesisJob

    a, b = make_tenant(), make_tenant()
    ja = a.client.post("/api/v1/speech", {"text": "Same key."}, HTTP_IDEMPOTENCY_KEY="shared").json()
    jb = b.client.post("/api/v1/speech", {"text": "Same key."}, HTTP_IDEMPOTENCY_KEY="shared").json()
    assert ja["id"] != jb["id"]
    IdempotencyKey.objects.filter(organization=a.org).update(
        created_at=IdempotencyKey.objects.get(organization=a.org).created_at - dt.timedelta(hours=25)
    )
    again = a.client.post("/api/v1/speech", {"text": "Same key."}, HTTP_IDEMPOTENCY_KEY="shared")
    assert again.status_code == 202 and again.json()["id"] != ja["id"]
    assert SynthesisJob.objects.filter(organization=a.org).count() == 2


def test_failed_submit_does_not_burn_the_key(make_tenant: Any) -> None:
    t = make_tenant(monthly_characters=5)
    over = t.client.post(
        "/api/v1/speech", {"text": "Too long for the plan."}, HTTP_IDEMPOTENCY_KEY="retry-me"
    )
    assert over.status_code == 429
    from webapp.speech.models import IdempotencyKey

    assert not IdempotencyKey.objects.filter(organization=t.org).exists()
