"""A job whose text was blanked after its plan's text retention reads sensibly everywhere (no 500)."""

from __future__ import annotations

from typing import Any

from tests.dashboard_data import make_job
from tests.integration.dashboard.conftest import client_for


def test_a_job_whose_text_is_gone_reads_sensibly_in_the_dashboard_and_the_api(owner: tuple[Any, Any]) -> None:
    from django.test import Client

    from webapp.tenants.services import OPERATOR, create_api_key

    user, org = owner
    # What blank_old_texts leaves: the row with its characters, the text empty.
    job = make_job(org, user, "", status="succeeded", text_chars=42)
    client = client_for(user)

    history = client.get("/app/history/")
    assert history.status_code == 200
    assert "Text removed after the plan's retention (42 characters)" in history.content.decode()
    assert client.get(f"/app/jobs/{job.pk}/").status_code == 200
    usage = client.get("/app/usage/")
    assert usage.status_code == 200 and "text 30 days" in usage.content.decode()

    _, raw = create_api_key(org, "reader", created_by=OPERATOR)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    answer = api.get(f"/api/v1/speech/{job.pk}")
    assert answer.status_code == 200 and answer.json()["text_chars"] == 42
    assert api.get("/api/v1/speech").status_code == 200
    assert api.get("/api/v1/usage").json()["plan"]["text_retention_days"] == 30
