"""Helpers for the API tests: tenants with their own plan and key, and a JSON client."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

_counter = itertools.count()
# What a test tenant's key carries unless the test asks for other scopes.
TEST_KEY_SCOPES = ["speech:read", "speech:write", "voices:write"]


@dataclass
class Tenant:
    org: Any
    key: Any
    raw_key: str
    client: ApiClient


class ApiClient:
    """A Django test client that sends our Bearer key and JSON bodies."""

    def __init__(self, raw_key: str | None) -> None:
        self.raw_key = raw_key
        self.client = Client()

    def _headers(self, extra: dict[str, str] | None) -> dict[str, Any]:
        # WSGI environ entries for the test client's ``**extra`` (typed Any there).
        headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {self.raw_key}"} if self.raw_key else {}
        headers.update(extra or {})
        return headers

    def get(self, path: str, data: dict[str, Any] | None = None, **headers: str) -> Any:
        return self.client.get(path, data or {}, **self._headers(headers))

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None, **headers: str) -> Any:
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        return self.client.post(path, payload, content_type="application/json", **self._headers(headers))

    def delete(self, path: str, **headers: str) -> Any:
        return self.client.delete(path, **self._headers(headers))


@pytest.fixture
def queued_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected: a worker 'serves' every voice and no message is sent (the broker 'is down'):
    accepted jobs stay queued, and no real worker is needed."""
    from webapp.speech import submission
    from webapp.speech.services import dispatch

    monkeypatch.setattr(submission, "require_worker_for", lambda *voice_speaker_fallback: None)
    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)


@pytest.fixture
def make_tenant(db: None) -> Callable[..., Tenant]:
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    def make(scopes: list[str] | None = None, **plan_limits: Any) -> Tenant:
        n = next(_counter)
        limits = {"requests_per_minute": 1000, "max_concurrent_jobs": 50, **plan_limits}
        plan = Plan.objects.create(slug=f"test-plan-{n}-{id(limits)}", name=f"Test plan {n}", **limits)
        org = create_organization(f"Tenant {n}", plan=plan)
        key, raw = create_api_key(org, "test key", created_by=OPERATOR, scopes=scopes or TEST_KEY_SCOPES)
        return Tenant(org=org, key=key, raw_key=raw, client=ApiClient(raw))

    return make


def problem(response: Any) -> dict[str, Any]:
    """The problem+json body of an error response (asserts the media type)."""
    assert response["Content-Type"].startswith("application/problem+json"), response["Content-Type"]
    body: dict[str, Any] = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    assert body["status"] == response.status_code
    return body


def wait_finished(client: ApiClient, job_id: str, timeout: float = 60) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/api/v1/speech/{job_id}", {"wait": "5"}).json()
        if body["status"] not in ("queued", "running") or time.monotonic() > deadline:
            return body


@pytest.fixture
def live_tenant(
    transactional_db: None, builtin_voices: list[str], synth_worker: Any
) -> Callable[..., Tenant]:
    """Tenants whose rows are committed, for tests that go through gunicorn/Nginx or threads."""
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    def make(scopes: list[str] | None = None, **plan_limits: Any) -> Tenant:
        n = next(_counter)
        limits = {"requests_per_minute": 1000, "max_concurrent_jobs": 50, **plan_limits}
        plan = Plan.objects.create(slug=f"live-plan-{n}-{id(limits)}", name=f"Live plan {n}", **limits)
        org = create_organization(f"Live tenant {n}", plan=plan)
        key, raw = create_api_key(org, "live key", created_by=OPERATOR, scopes=scopes or TEST_KEY_SCOPES)
        return Tenant(org=org, key=key, raw_key=raw, client=ApiClient(raw))

    return make


def base_url(web: Any) -> str:
    return f"https://127.0.0.1:{web.cfg.https_port}"


def https_port(web: Any) -> int:
    return int(web.cfg.https_port)


@pytest.fixture
def voice(builtin_voices: list[str]) -> str:
    """The realtime tests' voice: Piper's, which streams and gives word timestamps."""
    from tests.reliability.helpers import PIPER

    assert PIPER in builtin_voices
    return PIPER


@pytest.fixture
def full_lane(monkeypatch: pytest.MonkeyPatch, builtin_voices: list[str]) -> Iterator[None]:
    """Piper's interactive lane full: as many interactive jobs waiting as its children may have
    (TTS_INTERACTIVE_QUEUE_PER_CHILD, 8, per child serving it), queued with no message sent, so
    no worker takes them; canceled afterwards."""
    from django.conf import settings

    from tests.reliability.helpers import PIPER, make_org, submit
    from webapp.speech import lifecycle
    from webapp.speech.services import dispatch, eta

    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)
    children = max(1, sum(eta.serving_children("piper").values()))
    other = make_org("lane-full")
    waiting = [
        submit(other, f"Waiting {i}.", voice=PIPER, lane="interactive")
        for i in range(settings.TTS_INTERACTIVE_QUEUE_PER_CHILD * children)
    ]
    try:
        yield
    finally:
        for job in waiting:
            job.refresh_from_db()
            if job.status == "queued":
                lifecycle.cancel_job(job)


@pytest.fixture(scope="session")
def clients_python() -> Path:
    """The agent clients' interpreter (.venv-clients, with vLLM-Omni's wheel for its request models),
    made from tests/clients/requirements.lock when that changed."""
    root = Path(__file__).resolve().parents[3]
    subprocess.run([str(root / "tests" / "clients" / "prepare.sh")], check=True, timeout=600)
    return root / ".venv-clients" / "bin" / "python"
