"""Keys, members, history and jobs in the dashboard: roles decide, services change state."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.dashboard_data import make_job, member_of
from tests.integration.dashboard.conftest import client_for, redirect_url
from tests.redis_database import clear_cache
from webapp.speech.models import SynthesisJob
from webapp.tenants.models import ApiKey, Invitation, Membership


def test_a_new_key_is_shown_once_and_can_be_revoked(owner: tuple[Any, Any]) -> None:
    client = client_for(owner[0])
    page = client.post("/app/keys/", {"name": "ci", "scopes": ["speech:read"], "expires_in_days": "30"})
    shown = re.search(r"tts_[A-Za-z0-9]{8}_[A-Za-z0-9_-]{20,}", page.content.decode())
    assert shown is not None
    raw = shown.group(0)
    key = ApiKey.objects.get(name="ci")
    assert key.scopes == ["speech:read"] and key.expires_at is not None
    assert raw not in client.get("/app/keys/").content.decode()
    client.post(f"/app/keys/{key.pk}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is not None


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_cannot_manage_keys_or_people(owner: tuple[Any, Any], role: str) -> None:
    client = client_for(member_of(owner[1], f"{role}@example.com", role))
    assert client.get("/app/keys/").status_code == 403
    assert client.post("/app/keys/", {"name": "x", "scopes": ["speech:read"]}).status_code == 403
    assert client.post("/app/members/", {"email": "x@example.com", "role": "member"}).status_code == 403
    assert not Invitation.objects.exists()
    assert client.get("/app/history/").status_code == 200


def test_a_viewer_cannot_submit_jobs(owner: tuple[Any, Any]) -> None:
    client = client_for(member_of(owner[1], "viewer@example.com", "viewer"))
    response = client.post("/app/jobs/", json.dumps({"text": "Hi"}), content_type="application/json")
    assert response.status_code == 403


def test_the_last_owner_can_be_neither_removed_nor_demoted(owner: tuple[Any, Any]) -> None:
    user, org = owner
    client = client_for(user)
    mine = Membership.objects.get(user=user, organization=org)
    client.post(f"/app/members/{mine.pk}/remove/")
    client.post(f"/app/members/{mine.pk}/role/", {"role": "member"})
    mine.refresh_from_db()
    assert mine.role == "owner"
    second = member_of(org, "second@example.com", "owner")
    client.post(f"/app/members/{mine.pk}/role/", {"role": "member"})
    mine.refresh_from_db()
    assert mine.role == "member"
    assert Membership.objects.get(user=second).role == "owner"


def test_an_admin_cannot_remove_an_owner_or_make_one(owner: tuple[Any, Any]) -> None:
    user, org = owner
    admin = member_of(org, "admin@example.com", "admin")
    other = member_of(org, "member@example.com", "member")
    client = client_for(admin)
    client.post(f"/app/members/{Membership.objects.get(user=user).pk}/remove/")
    client.post(f"/app/members/{Membership.objects.get(user=other).pk}/role/", {"role": "owner"})
    assert Membership.objects.filter(user=user, role="owner").exists()
    assert Membership.objects.get(user=other).role == "member"
    client.post(f"/app/members/{Membership.objects.get(user=other).pk}/remove/")
    assert not Membership.objects.filter(user=other).exists()


def test_a_member_deletes_only_their_own_jobs(owner: tuple[Any, Any]) -> None:
    user, org = owner
    member = member_of(org, "member@example.com", "member")
    theirs, mine = make_job(org, user), make_job(org, member)
    client = client_for(member)
    client.post(f"/app/jobs/{theirs.pk}/delete/")
    client.post(f"/app/jobs/{mine.pk}/delete/")
    assert SynthesisJob.objects.filter(pk=theirs.pk).exists()
    assert not SynthesisJob.objects.filter(pk=mine.pk).exists()


def test_history_filters_by_status_voice_and_text(owner: tuple[Any, Any]) -> None:
    user, org = owner
    make_job(org, user, "The quick brown fox.")
    make_job(org, user, "A failed attempt.", status="failed")
    client = client_for(user)
    assert len(client.get("/app/history/").context["page"].object_list) == 2
    assert [j.text for j in client.get("/app/history/?q=brown").context["page"].object_list] == [
        "The quick brown fox."
    ]
    assert len(client.get("/app/history/?status=failed").context["page"].object_list) == 1
    assert len(client.get("/app/history/?voice=en_US-joe-medium").context["page"].object_list) == 2
    assert len(client.get("/app/history/?voice=nobody").context["page"].object_list) == 0
    assert client.get("/app/history/?page=999").status_code == 200


def test_another_tenants_job_is_not_found(owner: tuple[Any, Any]) -> None:
    from webapp.tenants.accounts import sign_up

    other_user, other_org = sign_up(
        email="other@example.com", password="x-long-passphrase-1", organization_name="O"
    )
    job = make_job(other_org, other_user)
    client = client_for(owner[0])
    for url in (f"/app/jobs/{job.pk}/", f"/app/jobs/{job.pk}/audio/"):
        assert client.get(url).status_code == 404
    assert client.post(f"/app/jobs/{job.pk}/cancel/").status_code == 404


def test_an_invalid_annotation_is_reported_with_its_position(
    owner: tuple[Any, Any], builtin_voices: list[str]
) -> None:
    client = client_for(owner[0])
    body = {"text": "Say 她[h][ao please", "voice": "en_US-joe-medium"}
    response = client.post("/app/jobs/", json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    error = response.json()  # problem+json, as the API answers
    assert response["Content-Type"] == "application/problem+json" and error["code"] == "invalid_annotation"
    assert error["field"] == "text" and isinstance(error["position"], int)
    assert error["position"] == body["text"].index("[ao")


def test_usage_page_shows_the_period_and_plan(owner: tuple[Any, Any]) -> None:
    page = client_for(owner[0]).get("/app/usage/")
    assert page.status_code == 200
    assert page.context["plan"].monthly_characters > 0
    assert page.context["quota"].percent == 0


def test_deleting_a_job_never_redirects_to_another_site(owner: tuple[Any, Any]) -> None:
    job = make_job(owner[1], owner[0])
    answer = client_for(owner[0]).post(f"/app/jobs/{job.pk}/delete/", {"next": "https://evil.example/"})
    assert redirect_url(answer) == "/app/history/"
    assert not SynthesisJob.objects.filter(pk=job.pk).exists()


def test_job_status_waits_for_a_change_and_answers_when_it_comes(transactional_db: None, stack: Any) -> None:
    import threading
    import time

    from tests.dashboard_data import make_owner
    from webapp.speech.services.notify import job_changed

    user, org = make_owner()
    job = make_job(org, user, status="running", progress=0.1)

    def move() -> None:
        time.sleep(1.0)
        SynthesisJob.objects.filter(pk=job.pk).update(progress=0.5)
        job_changed(job.pk, "running", 0.5)

    mover = threading.Thread(target=move)
    started = time.monotonic()
    mover.start()
    answer = client_for(user).get(f"/app/jobs/{job.pk}/?wait=10").json()
    mover.join()
    assert answer["progress"] == 0.5
    assert 0.9 < time.monotonic() - started < 8

    started = time.monotonic()
    unchanged = client_for(user).get(f"/app/jobs/{job.pk}/?wait=1").json()
    assert unchanged["progress"] == 0.5 and 0.9 < time.monotonic() - started < 5


def test_submits_beyond_the_plans_rate_get_a_readable_429(
    owner: tuple[Any, Any], builtin_voices: list[str]
) -> None:
    user, org = owner
    clear_cache()
    org.plan.requests_per_minute = 1
    org.plan.save()
    client = client_for(user)
    bad = json.dumps({"text": "Say [h][ao please"})  # refused after counting, so no job is made
    assert client.post("/app/jobs/", bad, content_type="application/json").status_code == 400
    second = client.post("/app/jobs/", bad, content_type="application/json")
    assert second.status_code == 429
    assert "try again in" in second.json()["detail"] and second.json()["code"] == "rate_limited"
