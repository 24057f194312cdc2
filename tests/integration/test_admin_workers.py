"""The admin console's Workers page: live worker children from their heartbeats in Redis."""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from tests.redis_database import redis_database
from webapp.speech import heartbeat
from webapp.speech.runtime import recycling

URL = "/admin/speech/workers/"


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    """The admin pages name hashed static files, as in production: that needs the manifest."""
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)


def _client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client(db: None) -> Client:
    return _client_for(User.objects.create_superuser("root", "root@example.test", "pw-root-123"))


@pytest.fixture
def private_redis(stack: Any) -> Iterator[Any]:
    """A Redis database of its own, so made-up heartbeats never reach other tests' workers."""
    with redis_database(stack, 14) as r:
        yield r


def test_it_lists_the_real_worker_with_its_host_and_pid(admin_client: Client, synth_worker: Any) -> None:
    beats = [b for b in heartbeat.live_workers() if b.get("state") == "ready"]
    assert beats, "the session worker should be beating"
    response = admin_client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    for beat in beats:
        assert f'data-pid="{beat["pid"]}"' in text
        assert html.escape(beat["host"]) in text
        assert html.escape(beat["node"]) in text
    row = response.context["workers"][0]
    assert row["state"] == "ready"
    assert row["voices"] == len(beats[0]["voices"]) > 0
    assert row["engines"] == ", ".join(beats[0]["engines"])
    assert row["beat_age"].endswith(" ago")
    assert row["loaded_age"].endswith(" ago")
    assert response.context["ready_count"] >= 1
    # Its node appears in the per-node summary.
    assert beats[0]["node"] in {n["node"] for n in response.context["nodes"]}
    assert "<script" not in text.split('id="content-main"', 1)[1]

    # Listed on the admin index (and the app page), linking to the page.
    index = admin_client.get("/admin/").content.decode()
    assert f'href="{URL}"' in index and ">Workers</a>" in index
    assert f'href="{URL}"' in admin_client.get("/admin/speech/").content.decode()


def test_it_shows_backoff_retry_time_recycles_by_reason_and_escapes_values(
    admin_client: Client, private_redis: Any
) -> None:
    now = time.time()
    node = "gpu-box-7:4242"
    beat: dict[str, Any] = {
        "worker_id": "gpu-box-7:4300",
        "node": node,
        "host": "gpu-box-7",
        "pid": 4300,
        "state": "backoff",
        "device": "cuda:0",
        "engines": ["piper"],
        "voices": [],
        "loaded_at": None,
        "tasks_done": 0,
        "max_tasks_per_child": 200,
        "rss_mb": 812.25,
        "gpu_mb": 1536.0,
        "rtf": {"piper": {"baseline": 0.05, "rolling": 0.21}},
        "recycles": 3,
        "last_recycle_reason": "rss 1600 MiB over 1500 MiB",
        "load_failures": 4,
        "load_attempts": 2,
        "next_retry_at": now + 16,
        "error": "RuntimeError: <b>CUDA</b> & friends",
        "at": now - 3,
    }
    heartbeat.publish(beat["worker_id"], beat, ttl=30)
    heartbeat.publish("broken:1", {"node": node, "pid": "x", "state": 5, "at": "yesterday"}, ttl=30)
    private_redis.set(heartbeat.KEY_PREFIX + "not-json:2", "{", ex=30)
    private_redis.sadd(heartbeat.INDEX_KEY, "not-json:2")
    recycling.record_recycle(private_redis, node, "rss 1600 MiB over 1500 MiB", 4100, 50)
    recycling.record_recycle(private_redis, node, "max_tasks 200 tasks", 4200, 200)
    recycling.record_recycle(private_redis, node, "rss 1700 MiB over 1500 MiB", 4250, 12)

    response = admin_client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    rows = {r["worker_id"]: r for r in response.context["workers"]}
    assert set(rows) == {"gpu-box-7:4300", ""}  # the undecodable key is skipped, the odd one shown
    row = rows["gpu-box-7:4300"]
    assert row["state"] == "backoff" and not row["healthy"]
    assert row["next_retry"].startswith("in 1")  # 15 or 16 s from now
    assert row["gpu_mb"] == "1,536.0" and row["rss_mb"] == "812.2"
    assert row["rtf"] == [{"engine": "piper", "rolling": "0.210", "baseline": "0.050"}]
    assert row["loaded_age"] == "-"
    assert "next retry in 1" in text
    assert "piper: 0.210 (0.050)" in text

    (summary,) = response.context["nodes"]
    assert summary["node"] == node and summary["children"] == 2 and summary["ready"] == 0
    assert summary["recycles"] == 3
    assert summary["reasons"] == [("rss", 2), ("max_tasks", 1)]
    assert summary["load_failures"] == 0
    # Newest first.
    assert [e["pid"] for e in summary["recent"]] == ["4250", "4200", "4100"]
    assert "rss: 2, max_tasks: 1" in text
    assert "pid 4250 after 12 tasks, rss 1700 MiB over 1500 MiB" in text

    # A heartbeat is foreign data: shown as text, never as markup.
    assert "<b>CUDA</b>" not in text
    assert "RuntimeError: &lt;b&gt;CUDA&lt;/b&gt; &amp; friends" in text


def test_it_says_so_when_no_worker_beats(admin_client: Client, private_redis: Any) -> None:
    response = admin_client.get(URL)
    assert response.status_code == 200
    assert 'id="no-workers"' in response.content.decode()
    assert response.context["workers"] == []


def test_it_answers_200_with_a_clear_message_when_redis_is_unreachable(admin_client: Client) -> None:
    with override_settings(REDIS_URL="redis://:nopass@127.0.0.1:1/0"):
        response = admin_client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    assert 'id="redis-error"' in text
    assert "Redis is unreachable" in text
    assert "ConnectionError" in text


def test_a_non_staff_user_is_sent_to_the_login_page(db: None) -> None:
    user = User.objects.create_user("alice", "alice@example.test", "pw-alice-123")
    user.user_permissions.add(Permission.objects.get(codename="view_synthesisjob"))
    for client in (_client_for(user), Client()):
        response = client.get(URL)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
        assert "speech/workers" in response["Location"]


def test_staff_need_the_view_permission(db: None, private_redis: Any) -> None:
    staff = User.objects.create_user("bob", "bob@example.test", "pw-bob-1234", is_staff=True)
    client = _client_for(staff)
    assert client.get(URL).status_code == 403
    assert URL not in client.get("/admin/").content.decode()

    staff.user_permissions.add(Permission.objects.get(codename="view_synthesisjob"))
    client = _client_for(User.objects.get(pk=staff.pk))  # a fresh permission cache
    assert client.get(URL).status_code == 200
    assert f'href="{URL}"' in client.get("/admin/").content.decode()


# ------------------------------------------------------------------ jobs and the ledger are read-only


def test_jobs_and_ledger_rows_are_read_only_and_paths_are_never_form_fields(admin_client: Client) -> None:
    import datetime as dt

    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod, Voice
    from webapp.tenants.services import create_organization

    org = create_organization("readonly-admin")
    job = SynthesisJob.objects.create(
        organization=org,
        voice_name="espeak-en-us",
        engine="espeak",
        text="Read me only.",
        text_chars=13,
        format="wav",
        status="succeeded",
        audio_path=f"audio/{org.id}/x.wav",
    )
    period = UsagePeriod.objects.create(organization=org, period=dt.date(2026, 1, 1), characters_used=13)
    event = UsageEvent.objects.create(
        organization=org, job_key=job.id, kind="charge", characters=13, period=dt.date(2026, 1, 1)
    )
    voice = Voice.objects.create(
        voice_id="readonly-admin-v",
        organization=org,
        name="v",
        engine="piper",
        language="en_US",
        sample_rate=22050,
        prompt_path="voices/p.wav",
    )
    for model, obj in (("synthesisjob", job), ("usageperiod", period), ("usageevent", event)):
        base = f"/admin/speech/{model}/"
        assert admin_client.get(base).status_code == 200
        assert admin_client.get(base + "add/").status_code == 403
        change = admin_client.get(f"{base}{obj.pk}/change/")
        assert change.status_code == 200 and b'type="submit"' not in change.content.split(b"content-main")[1]
        assert admin_client.post(f"{base}{obj.pk}/change/", {"status": "failed"}).status_code == 403
        assert admin_client.post(f"{base}{obj.pk}/delete/", {"post": "yes"}).status_code == 403
        assert admin_client.post(
            base, {"action": "delete_selected", "_selected_action": [obj.pk]}
        ).status_code in (
            200,
            302,
        )
    job.refresh_from_db()
    assert (job.status, job.audio_path) == ("succeeded", f"audio/{org.id}/x.wav")
    assert (
        UsageEvent.objects.filter(pk=event.pk).exists() and UsagePeriod.objects.filter(pk=period.pk).exists()
    )
    # Found by id and by text; a search term that is no UUID is no error.
    for term in (str(job.id), "Read me"):
        assert admin_client.get("/admin/speech/synthesisjob/", {"q": term}).context["cl"].result_count == 1
    assert admin_client.get("/admin/speech/synthesisjob/", {"q": "no-such-id"}).status_code == 200

    form = admin_client.get(f"/admin/speech/voice/{voice.pk}/change/").context["adminform"].form
    assert "prompt_path" not in form.fields and "name" in form.fields
