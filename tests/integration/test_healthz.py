"""GET /healthz: 200 with every check ok, 503 naming the failing one, no internals.

/healthz/ready (web readiness: database and Redis, the workers only reported) and /healthz/live
(the process answers) are the Kubernetes probes' (webapp/health.py)."""

from __future__ import annotations

import json
from collections.abc import Coroutine, Mapping
from typing import Any, cast

import pytest
from django.test import Client, override_settings

from webapp import redis_clients
from webapp.speech import heartbeat


def test_it_is_ok_with_db_redis_and_a_worker(db: None, synth_worker: Any) -> None:
    response = Client().get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body == {"status": "ok", "checks": {"db": "ok", "redis": "ok", "workers": "ok"}}


def test_it_names_the_missing_worker(db: None, stack: Any) -> None:
    # A Redis database with no heartbeats: reachable, but no worker beats there.
    url = stack.cfg.redis_url.rsplit("/", 1)[0] + "/15"
    with override_settings(REDIS_URL=url):
        response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"] == {"db": "ok", "redis": "ok", "workers": "fail"}
    assert body["failing"] == ["workers"]
    assert response["Retry-After"]


@pytest.mark.parametrize(("state", "expected"), [("recycling", 200), ("starting", 503), ("failed", 503)])
def test_a_node_whose_children_are_all_being_replaced_is_healthy(
    db: None, stack: Any, state: str, expected: int
) -> None:
    # Both children of the only node reached their task limit together: while the replacements
    # load, submits are accepted (they queue) and /healthz must not take the web node out of a
    # load balancer for it. Seen in the waiting benchmark: 24 x 503 within 1.7 s.
    url = stack.cfg.redis_url.rsplit("/", 1)[0] + "/15"
    with override_settings(REDIS_URL=url):
        redis_clients.heartbeats().flushdb()  # database 15 is this test's own
        for pid in (101, 102):
            heartbeat.publish(
                f"node-a:{pid}", {"worker_id": f"node-a:{pid}", "node": "node-a", "state": state}
            )
        try:
            response = Client().get("/healthz")
        finally:
            redis_clients.heartbeats().flushdb()
    assert response.status_code == expected, response.content
    assert response.json()["checks"]["workers"] == ("ok" if expected == 200 else "fail")


def test_it_names_redis_when_redis_is_unreachable(db: None) -> None:
    with override_settings(REDIS_URL="redis://:nopass@127.0.0.1:1/0"):
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


# --------------------------------------------------------------------- under ASGI, before Django


def _asgi(
    method: str, headers: list[tuple[bytes, bytes]] | None = None, path: str = "/healthz"
) -> tuple[int, dict[str, str], bytes, list[str]]:
    """One request to the ASGI application's /healthz; Django's handler replaced by a recorder."""
    import asyncio

    from webapp.health import answered_first

    passed_on: list[str] = []

    async def django(scope: dict[str, Any], receive: Any, send: Any) -> None:
        passed_on.append(scope["method"])
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[Mapping[str, Any]] = []

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
    # An ASGI app is typed to return an Awaitable; this one is an ``async def``: a coroutine.
    asyncio.run(cast("Coroutine[Any, Any, None]", answered_first(django)(scope, receive, send)))
    start, body = sent
    names = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], names, body["body"], passed_on


def _count(status: str, view: str = "healthz") -> float:
    from prometheus_client import REGISTRY

    labels = {"view": view, "method": "GET", "status": status}
    return REGISTRY.get_sample_value("tts_http_requests_total", labels) or 0.0


def test_under_asgi_it_answers_as_the_view_does_without_django(db: None, synth_worker: Any) -> None:
    before = _count("200")
    status, headers, body, passed_on = _asgi("GET", [(b"x-request-id", b"probe-1")])
    assert passed_on == []  # no request thread, no middleware chain
    assert _count("200") == before + 1  # counted under the view's name, as Django's answers are
    assert status == 200
    assert json.loads(body) == Client().get("/healthz").json()
    assert headers["content-type"] == "application/json" and headers["content-length"] == str(len(body))
    assert "no-store" in headers["cache-control"] and headers["x-content-type-options"] == "nosniff"
    assert headers["x-request-id"] == "probe-1"

    forged = _asgi("GET", [(b"x-request-id", b"bad id\nnewline")])[1]["x-request-id"]
    assert forged != "bad id\nnewline" and len(forged) == 32
    status, headers, body, _ = _asgi("HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_under_asgi_other_methods_go_to_django(db: None) -> None:
    assert _asgi("POST")[3] == ["POST"]


def test_under_asgi_a_failing_check_is_a_503_with_retry_after(db: None) -> None:
    with override_settings(REDIS_URL="redis://:nopass@127.0.0.1:1/0"):
        status, headers, body, _ = _asgi("GET")
    assert status == 503 and headers["retry-after"]
    assert json.loads(body)["failing"] == ["redis", "workers"]


def test_under_asgi_probes_during_one_check_share_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many probes come at once, a process runs one check at a time (a database that
    hangs holds one thread, not one per probe)."""
    import asyncio
    import threading
    import time

    from webapp import health

    calls = []

    def slow_check() -> tuple[dict[str, object], int]:
        calls.append(threading.get_ident())
        time.sleep(0.3)  # injected: a slow database
        return {"status": "ok"}, 200

    monkeypatch.setattr(health, "check", slow_check)
    sent: list[list[Mapping[str, Any]]] = [[] for _ in range(5)]

    async def probes() -> None:
        async def probe(i: int) -> None:
            async def send(message: Mapping[str, Any]) -> None:
                sent[i].append(message)

            await health.answer({"type": "http", "method": "GET", "path": "/healthz", "headers": []}, send)

        await asyncio.gather(*(probe(i) for i in range(5)))
        await probe(0)  # one that comes after: a check of its own

    asyncio.run(probes())
    assert len(calls) == 2
    assert [messages[0]["status"] for messages in sent] == [200] * 5


def test_under_asgi_a_connection_that_fails_to_close_is_no_500(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DatabaseError

    from webapp import health

    class Broken:
        def close(self) -> None:
            raise DatabaseError("server closed the connection unexpectedly")  # injected

    monkeypatch.setattr(health, "check", lambda: ({"status": "fail"}, 503))
    monkeypatch.setattr(health, "connection", Broken())
    status, headers, _, _ = _asgi("GET")
    assert status == 503 and headers["retry-after"]


# --------------------------------------------------------------------- /healthz/ready, /healthz/live


@pytest.fixture
def empty_redis(stack: Any) -> Any:
    """A reachable Redis database with no heartbeats (database 15 is these tests' own)."""
    url = stack.cfg.redis_url.rsplit("/", 1)[0] + "/15"
    with override_settings(REDIS_URL=url):
        redis_clients.heartbeats().flushdb()
        try:
            yield
        finally:
            redis_clients.heartbeats().flushdb()


def test_ready_stays_200_with_no_worker_and_reports_the_census(db: None, empty_redis: None) -> None:
    # A worker pool scaled to zero: the web pod must stay in its Service (submits queue).
    response = Client().get("/healthz/ready")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"db": "ok", "redis": "ok"}, "workers": "none"}
    assert Client().get("/healthz").status_code == 503  # the whole-site check still says so
    heartbeat.publish("node-a:101", {"worker_id": "node-a:101", "node": "node-a", "state": "ready"})
    assert Client().get("/healthz/ready").json()["workers"] == "ok"


def test_ready_is_503_naming_redis_when_redis_is_unreachable(db: None) -> None:
    with override_settings(REDIS_URL="redis://:nopass@127.0.0.1:1/0"):
        response = Client().get("/healthz/ready")
    assert response.status_code == 503 and response["Retry-After"]
    body = response.json()
    assert body["failing"] == ["redis"] and body["workers"] == "unknown"
    assert set(body) <= {"status", "checks", "failing", "workers"}


def test_ready_is_503_naming_the_database_when_it_fails(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from webapp import health

    monkeypatch.setattr(health, "_check_db", lambda: False)  # injected: the database away
    response = Client().get("/healthz/ready")
    assert response.status_code == 503 and response.json()["failing"] == ["db"]


def test_live_answers_without_redis_or_the_database(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from webapp import health

    monkeypatch.setattr(health, "_check_db", lambda: False)
    with override_settings(REDIS_URL="redis://:nopass@127.0.0.1:1/0"):
        response = Client().get("/healthz/live")
        assert response.status_code == 200 and response.json() == {"status": "ok"}
        status, headers, body, passed_on = _asgi("GET", path="/healthz/live")
    assert (status, json.loads(body), passed_on) == (200, {"status": "ok"}, [])
    assert "no-store" in headers["cache-control"]


def test_under_asgi_ready_is_answered_before_django_and_counted_as_its_view(
    db: None, empty_redis: None
) -> None:
    before = _count("200", view="healthz_ready")
    status, headers, body, passed_on = _asgi("GET", path="/healthz/ready")
    assert passed_on == [] and status == 200
    assert json.loads(body) == Client().get("/healthz/ready").json()
    assert _count("200", view="healthz_ready") == before + 2  # this one and the view's
    assert _asgi("GET", path="/healthz/elsewhere")[3] == ["GET"]  # not a health path: Django's


def test_the_probes_are_not_redirected_to_https(db: None, settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    for path in ("/healthz", "/healthz/ready", "/healthz/live"):
        assert Client().get(path).status_code != 301, path
