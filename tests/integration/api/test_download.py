"""Submit, long-poll and download real audio through Nginx (X-Accel-Redirect)."""

from __future__ import annotations

import io
import time
from typing import Any

import requests
import soundfile
import urllib3

from tests.integration.api.conftest import base_url

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def test_submit_poll_download_through_nginx(live_tenant: Any, web: Any) -> None:
    t = live_tenant()
    s = requests.Session()
    s.verify = False
    s.trust_env = False  # else REQUESTS_CA_BUNDLE overrides verify=False
    s.headers["Authorization"] = f"Bearer {t.raw_key}"
    url = base_url(web)
    created = s.post(
        f"{url}/api/v1/speech",
        json={"text": "The quick brown fox jumps over the lazy dog.", "format": "flac"},
    )
    assert created.status_code == 202, created.text
    assert created.headers["RateLimit-Policy"] == '"minute";q=1000;w=60'
    job = created.json()
    deadline = time.monotonic() + 60
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        job = s.get(f"{url}/api/v1/speech/{job['id']}", params={"wait": 10}).json()
    assert job["status"] == "succeeded", job
    assert job["audio_url"].endswith(f"/api/v1/speech/{job['id']}/audio")
    assert job["metrics"]["engine"] == "piper" and job["metrics"]["synth_ms"] is not None
    assert job["duration_seconds"] > 1.0 and job["expires_at"] and job["finished_at"]
    audio = s.get(job["audio_url"])
    assert audio.status_code == 200
    assert audio.headers["Content-Type"] == "audio/flac"
    assert audio.headers["Content-Disposition"] == f'attachment; filename="{job["id"]}.flac"'
    data, rate = soundfile.read(io.BytesIO(audio.content))
    assert abs(len(data) / rate - job["duration_seconds"]) < 0.1
    # Range requests work because Nginx serves the file.
    part = s.get(job["audio_url"], headers={"Range": "bytes=0-99"})
    assert part.status_code == 206 and len(part.content) == 100
    # Nginx's internal location is not reachable from outside.
    assert s.get(f"{url}/_protected/media/audio/{t.org.pk}/{job['id']}.flac").status_code == 404
    # The usage ledger charged the job.
    usage = s.get(f"{url}/api/v1/usage").json()
    assert usage["characters"]["used"] == job["text_chars"] and usage["characters"]["reserved"] == 0
    # Deleting the job removes its audio.
    assert s.delete(f"{url}/api/v1/speech/{job['id']}").status_code == 204
    assert s.get(job["audio_url"]).status_code == 404
