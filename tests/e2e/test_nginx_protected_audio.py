"""Audio through X-Accel-Redirect: Django checks ownership, Nginx streams the file (Range included).

The job row and its WAV file are made here directly (a finished job, as the
worker would leave it), so the test is about the edge, not about synthesis.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
import wave
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from tests.e2e.nginx_helpers import HSTS, client
from tests.stack import CFG

pytestmark = [pytest.mark.usefixtures("web"), pytest.mark.django_db(transaction=True)]


def _write_wav(path: Path, seconds: float = 0.5, rate: int = 22050) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
        for i in range(int(seconds * rate))
    )
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames)
    return path.read_bytes()


@pytest.fixture
def finished_job() -> dict[str, Any]:
    from webapp.speech.models import SynthesisJob
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    org = create_organization("Edge Audio")
    _key, secret = create_api_key(org, "edge", created_by=OPERATOR)
    now = timezone.now()
    job = SynthesisJob.objects.create(
        organization=org,
        voice_name="en_US-joe-medium",
        engine="piper",
        text="edge audio",
        text_chars=10,
        format="wav",
        status=SynthesisJob.Status.SUCCEEDED,
        progress=1.0,
        started_at=now,
        finished_at=now,
        expires_at=now + dt.timedelta(days=1),
    )
    relative = f"audio/{org.id}/{job.id}.wav"
    data = _write_wav(Path(settings.MEDIA_ROOT) / relative)
    SynthesisJob.objects.filter(pk=job.pk).update(audio_path=relative, audio_bytes=len(data))
    return {"id": str(job.id), "path": relative, "data": data, "auth": {"Authorization": f"Bearer {secret}"}}


def _audio_url(job_id: str) -> str:
    return f"https://127.0.0.1:{CFG.https_port}/api/v1/speech/{job_id}/audio"


def test_range_request_is_answered_with_206(finished_job: dict[str, Any]) -> None:
    data: bytes = finished_job["data"]
    response = client().get(
        _audio_url(finished_job["id"]), headers={**finished_job["auth"], "Range": "bytes=0-99"}, timeout=20
    )
    assert response.status_code == 206, response.text[:300]
    assert response.headers["Content-Range"] == f"bytes 0-99/{len(data)}"
    assert response.content == data[:100]
    assert response.headers["Content-Type"] == "audio/wav"
    # Django's headers survive the redirect, once; the edge's security headers are there too.
    assert response.headers["Cache-Control"] == "private, no-store"
    assert response.headers["Content-Disposition"].startswith("attachment;")
    assert response.headers["Strict-Transport-Security"] == HSTS
    assert "X-Accel-Redirect" not in response.headers

    tail = client().get(
        _audio_url(finished_job["id"]), headers={**finished_job["auth"], "Range": "bytes=-16"}, timeout=20
    )
    assert tail.status_code == 206 and tail.content == data[-16:]


def test_whole_file_and_range_support_advertised(finished_job: dict[str, Any]) -> None:
    response = client().get(_audio_url(finished_job["id"]), headers=finished_job["auth"], timeout=20)
    assert response.status_code == 200
    assert response.headers["Accept-Ranges"] == "bytes"
    assert response.content == finished_job["data"]


def test_audio_needs_the_owner(finished_job: dict[str, Any]) -> None:
    anonymous = client().get(_audio_url(finished_job["id"]), headers={"Range": "bytes=0-99"}, timeout=20)
    assert anonymous.status_code == 401
    assert anonymous.content != finished_job["data"][:100]


def test_internal_location_is_not_reachable_directly(finished_job: dict[str, Any]) -> None:
    path = settings.TTS_ACCEL_REDIRECT_PREFIX + finished_job["path"]
    assert (Path(settings.MEDIA_ROOT) / finished_job["path"]).exists()
    session = client()
    for candidate in (path, path.replace("/_protected/", "/_protected//"), path.upper()):
        response = session.get(
            f"https://127.0.0.1:{CFG.https_port}{candidate}", headers={"Range": "bytes=0-99"}, timeout=20
        )
        assert response.status_code == 404, candidate
        assert response.content != finished_job["data"][:100]
        assert response.headers["Strict-Transport-Security"] == HSTS
