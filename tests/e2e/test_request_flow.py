"""One request end to end: client -> Nginx (TLS) -> gunicorn/Django -> Celery worker -> audio back."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
import requests
import soundfile
import urllib3

from tests.stack import CFG

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
BASE = f"https://127.0.0.1:{CFG.https_port}"


@pytest.fixture
def api_key(transactional_db: None, builtin_voices: list[str]) -> str:
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    org = create_organization("E2E tenant")
    _, raw = create_api_key(org, "e2e", created_by=OPERATOR)
    return raw


def test_speech_goes_through_nginx_django_and_a_worker(web: Any, synth_worker: Any, api_key: str) -> None:
    session = requests.Session()
    session.verify = False
    session.trust_env = False  # else the machine's REQUESTS_CA_BUNDLE overrides verify=False
    session.headers["Authorization"] = f"Bearer {api_key}"

    created = session.post(
        f"{BASE}/api/v1/speech",
        json={"text": "Hello from the edge. Two sentences.", "format": "wav"},
        timeout=30,
    )
    assert created.status_code == 202, created.text
    assert created.headers["Strict-Transport-Security"].startswith("max-age=")
    job = created.json()
    assert job["status"] in ("queued", "running", "succeeded")

    deadline = time.monotonic() + 90
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        job = session.get(f"{BASE}/api/v1/speech/{job['id']}", params={"wait": 10}, timeout=30).json()
    assert job["status"] == "succeeded", job
    assert job["metrics"]["worker"] and job["metrics"]["engine"] == "piper"

    audio = session.get(f"{BASE}/api/v1/speech/{job['id']}/audio", timeout=30)
    assert audio.status_code == 200
    assert audio.headers["Content-Type"].startswith("audio/")
    assert "X-Accel-Redirect" not in audio.headers  # Nginx consumed it and served the file
    data, rate = soundfile.read(io.BytesIO(audio.content))
    assert rate == 22050
    assert 1.0 < len(data) / rate < 10.0
    assert abs(len(data) / rate - job["duration_seconds"]) < 0.1
