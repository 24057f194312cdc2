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


def test_it_downloads_a_jobs_captions_where_it_has_timestamps(owner: tuple[Any, Any]) -> None:
    from webapp.speech.models import JobTimestamps

    user, org = owner
    timed = make_job(org, user, "Hello there. Goodbye now.", audio_path="a.wav", duration_seconds=2.0)
    sentences = [
        {"index": 0, "text": "Hello there.", "start": 0.0, "end": 0.9, "char_start": 0, "char_end": 12},
        {"index": 1, "text": "Goodbye now.", "start": 1.1, "end": 2.0, "char_start": 13, "char_end": 25},
    ]
    JobTimestamps.objects.create(job=timed, words=[], sentences=sentences)
    untimed = make_job(org, user, "No timestamps here.", audio_path="b.wav")
    client = client_for(user)
    html = client.get("/app/history/").content.decode()
    assert f"/app/jobs/{timed.id}/captions/?format=srt" in html
    assert f"/app/jobs/{untimed.id}/captions/" not in html
    srt = client.get(f"/app/jobs/{timed.id}/captions/", {"format": "srt"})
    assert srt.status_code == 200 and srt["Content-Disposition"].startswith("attachment")
    assert "00:00:01,100 --> 00:00:02,000\nGoodbye now." in srt.content.decode()
    vtt = client.get(f"/app/jobs/{timed.id}/captions/", {"format": "vtt"}).content.decode()
    assert vtt.startswith("WEBVTT") and "Hello there." in vtt
    assert client.get(f"/app/jobs/{untimed.id}/captions/").status_code == 404
    other_user, other_org = make_owner("someone@example.com", "Elsewhere")
    assert client_for(other_user).get(f"/app/jobs/{timed.id}/captions/").status_code == 404
