"""A statement past the web tier's statement timeout answers a clear 503 and changes nothing (issue 49).

Through a real gunicorn whose statement timeout is 1 s, while another session holds a lock the
request's statements queue behind (as a migration's would): the request ends at the timeout, with a
problem+json the client can act on, instead of holding a web thread for as long as the lock lasts.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.stack import TestStack, tcp_gunicorn
from webapp.env import STATEMENT_TIMEOUTS, process_kind


@pytest.fixture(scope="module")
def impatient_web(stack: TestStack, web: Any) -> Iterator[int]:
    """gunicorn on 127.0.0.1:<port> with a statement timeout of 1 s."""
    with tcp_gunicorn(stack, "gunicorn-impatient", TTS_DB_STATEMENT_TIMEOUT_SECONDS="1") as port:
        yield port


def _call(
    port: int, key: str, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, Any, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {
        "Authorization": f"Bearer {key}",
        "X-Forwarded-Proto": "https",
        "X-Real-IP": "127.0.0.1",
        "Content-Type": "application/json",
    }
    started = time.monotonic()
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        elapsed = time.monotonic() - started
        return (
            answer.status,
            (answer.getheader("Content-Type"), answer.getheader("Retry-After"), data),
            elapsed,
        )
    finally:
        conn.close()


def test_a_statement_past_the_web_timeout_is_a_clear_503_and_writes_nothing(
    live_tenant: Any, impatient_web: int
) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent

    t = live_tenant()
    assert _call(impatient_web, t.raw_key, "GET", "/api/v1/speech")[0] == 200
    locker = psycopg.connect(**connection.get_connection_params())
    try:
        with locker.transaction():
            # What a migration altering the jobs table holds: every read and write of it queues.
            locker.execute("LOCK TABLE speech_synthesisjob IN ACCESS EXCLUSIVE MODE")
            held_since = time.monotonic()
            listed = _call(impatient_web, t.raw_key, "GET", "/api/v1/speech")
            submitted = _call(
                impatient_web, t.raw_key, "POST", "/api/v1/speech", {"text": "Queued behind a lock."}
            )
            held = time.monotonic() - held_since
    finally:
        locker.close()
    for status, (content_type, retry_after, data), elapsed in (listed, submitted):
        assert status == 503, data
        assert content_type == "application/problem+json" and retry_after == "5"
        problem = json.loads(data)
        assert problem["code"] == "service_unavailable"
        assert "did not answer this request within 1 s" in problem["detail"], problem
        assert 0.9 < elapsed < 4, elapsed  # ended by the timeout, not by the lock's release
    assert held >= listed[2] + submitted[2]  # both waited while the lock was held
    # Nothing half-written: no job, no reservation.
    assert not SynthesisJob.objects.filter(organization=t.org).exists()
    assert not UsageEvent.objects.filter(organization=t.org).exists()
    assert _call(impatient_web, t.raw_key, "GET", "/api/v1/speech")[0] == 200


def test_each_kind_of_process_has_its_own_statement_timeout() -> None:
    kinds = {
        name: process_kind(name, role)
        for name, role in [
            ("gunicorn", "synth"),
            ("worker-cpu", "synth"),
            ("worker-gpu", "synth"),
            ("housekeeping", "housekeeping"),
            ("webhooks", "webhooks"),
            ("analysis", "analysis"),
            ("beat", "synth"),
            ("migrate", "synth"),
            ("django", "synth"),  # a shell or a management command: no name set
        ]
    }
    assert kinds == {
        "gunicorn": "web",
        "worker-cpu": "synth",
        "worker-gpu": "synth",
        "housekeeping": "housekeeping",
        "webhooks": "webhooks",
        "analysis": "analysis",
        "beat": "beat",
        "migrate": "migrate",
        "django": "other",
    }
    timeouts = {kind: STATEMENT_TIMEOUTS.get(kind, 0) for kind in kinds.values()}
    assert timeouts["other"] == 0 and timeouts["web"] < timeouts["synth"] < timeouts["housekeeping"]
    assert timeouts["migrate"] >= 600
