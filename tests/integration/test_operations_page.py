"""The Operations page: live figures from heartbeats and rows, its JSON refresh, snapshots and charts."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from webapp import redis_clients
from webapp.speech import heartbeat

URL = "/admin/speech/operations/"


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)


@pytest.fixture
def admin_client(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.test", "pw-ops-123"))
    return client


def test_it_lists_a_running_worker_with_its_memory_figures(admin_client: Client, synth_worker: Any) -> None:
    beat = next(b for b in heartbeat.live_workers() if b.get("state") == "ready")
    response = admin_client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    assert f'data-pid="{beat["pid"]}"' in text and html.escape(beat["host"]) in text
    row = next(w for w in response.context["workers"] if w["pid"] == str(beat["pid"]))
    assert float(row["rss_mb"].replace(",", "")) > 10  # a loaded model is megabytes, not nothing
    assert row["gpu_mb"] == "-"  # a CPU worker holds no GPU memory
    assert "rss" in row["closest_recycle"] and "%" in row["closest_recycle"]
    assert dict(response.context["queues"])["synth.espeak"] >= 0
    # The script is a static file (CSP: no inline script) and the page links the data URL.
    assert re.search(r'<script src="/static/admin/speech/operations\.[0-9a-f]{12}\.js" defer>', text)
    assert 'data-url="/admin/speech/operations/data.json"' in text
    assert "<script>" not in text

    data = admin_client.get(URL + "data.json").json()
    assert str(beat["pid"]) in {w["pid"] for w in data["workers"]}
    assert f'data-pid="{beat["pid"]}"' in data["html"]
    assert set(data["jobs"]["by_status"]) >= {"queued", "running", "succeeded", "failed"}


def test_the_snapshot_job_stores_a_row_the_charts_draw(admin_client: Client, synth_worker: Any) -> None:
    from webapp.housekeeping.catalog import run_job
    from webapp.housekeeping.models import OperationsSnapshot

    run_job("snapshot_operations")
    snap = OperationsSnapshot.objects.latest("at")
    assert snap.data["ready"] >= 1 and snap.data["rss_mb_total"] > 10
    charts = admin_client.get(URL).context["charts"]
    assert len(charts) == 6
    assert any("<polyline" in str(c) for c in charts)


def test_non_staff_are_sent_to_log_in(db: None) -> None:
    user = User.objects.create_user("plain", "plain@example.test", "pw-plain-123")
    client = Client()
    client.force_login(user)
    for url in (URL, URL + "data.json"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.post(URL + "recycle/").status_code == 302


def test_a_refused_recycle_is_shown_and_audited(admin_client: Client, synth_worker: Any) -> None:
    from webapp.audit.models import AuditEvent
    from webapp.speech.runtime import rolling

    redis_clients.heartbeats().delete(rolling.PLAN_KEY)
    beat = next(b for b in heartbeat.live_workers() if b.get("state") == "ready")
    response = admin_client.post(URL + "recycle/", {"node": beat["node"]}, follow=True)
    assert response.status_code == 200
    assert "Recycle workers refused" in response.content.decode()
    event = AuditEvent.objects.get(action="workers.recycle_refused")
    assert "only one worker child" in event.details["reason"]
    assert redis_clients.heartbeats().get(rolling.PLAN_KEY) is None
