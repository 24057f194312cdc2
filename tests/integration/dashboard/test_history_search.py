"""History that helps (issue 35): search in the text, filters by voice, status, source and date, and
"edit and re-render", the synthesize form filled from a job."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from tests.dashboard_data import make_job, make_owner
from tests.integration.dashboard.conftest import client_for


def _shown(client: Any, **query: str) -> set[str]:
    page = client.get("/app/history/", query)
    assert page.status_code == 200
    return {job.text for job in page.context["page"].object_list}


def test_it_finds_jobs_by_text_voice_status_source_and_date(owner: tuple[Any, Any]) -> None:
    user, org = owner
    now = timezone.now()
    make_job(org, user, "The quarterly report is ready.", voice_name="en_US-amy-medium", source="api")
    make_job(org, user, "Welcome aboard, new colleague.", status="failed", source="openai")
    old = make_job(org, user, "An old REPORT from last year.", source="dashboard")
    old.created_at = now - dt.timedelta(days=40)
    old.save()
    client = client_for(user)
    assert _shown(client, q="report") == {"The quarterly report is ready.", "An old REPORT from last year."}
    assert _shown(client, voice="en_US-amy-medium") == {"The quarterly report is ready."}
    assert _shown(client, status="failed") == {"Welcome aboard, new colleague."}
    assert _shown(client, source="dashboard") == {"An old REPORT from last year."}
    since = (now - dt.timedelta(days=1)).date().isoformat()
    assert _shown(client, q="report", created_from=since) == {"The quarterly report is ready."}
    until = (now - dt.timedelta(days=30)).date().isoformat()
    assert _shown(client, created_to=until) == {"An old REPORT from last year."}
    wrong = client.get("/app/history/", {"created_from": "2026-05-02", "created_to": "2026-05-01"})
    assert "The last day comes before the first." in wrong.content.decode()


def test_it_fills_the_form_from_a_job_to_edit_and_render_again(owner: tuple[Any, Any]) -> None:
    user, org = owner
    job = make_job(
        org,
        user,
        "Read me <again> & again.",
        voice_name="en_US-amy-medium",
        format="mp3",
        params={"speed": 1.25, "instructions": "a bit slower"},
    )
    client = client_for(user)
    history = client.get("/app/history/").content.decode()
    assert f"/app/synthesize/?from_job={job.id}" in history and "Edit and re-render" in history
    form = client.get("/app/synthesize/", {"from_job": str(job.id)})
    html = form.content.decode()
    assert ">Read me &lt;again&gt; &amp; again.</textarea>" in html
    assert '<option value="mp3" selected>' in html and 'value="1.25"' in html
    assert 'value="a bit slower"' in html and 'id="prefill-note"' in html
    assert form.context["default_voice"] == "en_US-amy-medium"


def test_it_does_not_fill_the_form_from_another_tenants_job(owner: tuple[Any, Any]) -> None:
    other_user, other_org = make_owner("other@example.com", "Other")
    theirs = make_job(other_org, other_user, "Not yours.")
    client = client_for(owner[0])
    assert client.get("/app/synthesize/", {"from_job": str(theirs.id)}).status_code == 404
    assert client.get("/app/synthesize/", {"from_job": "not-a-uuid"}).status_code == 404
