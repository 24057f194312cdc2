"""GET /healthz: 200 with every check ok, 503 naming the failing one, no internals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

from webapp.speech import heartbeat


@pytest.fixture(autouse=True)
def _fresh_redis_client() -> Iterator[None]:
    heartbeat._client = None
    yield
    heartbeat._client = None


def test_it_is_ok_with_db_redis_and_a_worker(db: None, synth_worker: Any) -> None:
    response = Client().get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body == {"status": "ok", "checks": {"db": "ok", "redis": "ok", "workers": "ok"}}


def test_it_names_the_missing_worker(db: None, stack: Any) -> None:
    # A Redis database with no heartbeats: reachable, but no worker beats there.
    url = stack.cfg.redis_url.rsplit("/", 1)[0] + "/15"
    with override_settings(REDIS_URL=url):
        heartbeat._client = None
        response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"] == {"db": "ok", "redis": "ok", "workers": "fail"}
    assert body["failing"] == ["workers"]
    assert response["Retry-After"]


def test_it_names_redis_when_redis_is_unreachable(db: None) -> None:
    with override_settings(REDIS_URL="redis://:nopass@127.0.0.1:1/0"):
        heartbeat._client = None
        response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"] == "fail"
    assert "redis" in response.json()["failing"]


def test_it_shows_no_hosts_pids_or_versions(db: None, synth_worker: Any) -> None:
    text = Client().get("/healthz").content.decode()
    workers = heartbeat.live_workers()
    assert workers, "the session worker should be beating"
    for w in workers:
        assert str(w["pid"]) not in text
        assert w["host"] not in text
    assert "version" not in text.lower()
    assert set(json.loads(text)) <= {"status", "checks", "failing"}
