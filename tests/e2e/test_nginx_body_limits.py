"""Body sizes at the edge: small everywhere, larger only for voice uploads (TTS_MAX_UPLOAD_BYTES)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings

from deploy import nginx as deploy_nginx
from tests.e2e.nginx_helpers import HSTS, PROBLEM_JSON, client
from tests.stack import CFG

pytestmark = pytest.mark.usefixtures("web")

# The same settings Nginx's limits are rendered from (TTS_MAX_BODY_BYTES, TTS_MAX_UPLOAD_BYTES).
SMALL_LIMIT = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
UPLOAD_LIMIT = settings.TTS_MAX_UPLOAD_BYTES
SOURCE = "127.0.0.7"  # its own address: these POSTs must not fill 127.0.0.1's zones


def _url(path: str) -> str:
    return f"https://127.0.0.1:{CFG.https_port}{path}"


def test_json_body_over_the_limit_is_a_problem_413() -> None:
    response = client(SOURCE).post(
        _url("/api/v1/speech"),
        data=b'{"text": "' + b"a" * (SMALL_LIMIT + 1) + b'"}',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.headers["Content-Type"] == PROBLEM_JSON
    assert response.headers["Strict-Transport-Security"] == HSTS
    body = response.json()
    assert body["status"] == 413 and body["code"] == "request_too_large"


def test_chunked_body_over_the_limit_is_a_problem_413() -> None:
    # No Content-Length: Nginx counts while reading and stops at the limit.
    def chunks() -> Iterator[bytes]:
        for _ in range(SMALL_LIMIT // 65536 + 2):
            yield b"a" * 65536

    response = client(SOURCE).post(
        _url("/api/v1/voices/does-not-matter"),
        data=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.headers["Content-Type"] == PROBLEM_JSON


def test_openai_body_over_the_limit_is_an_openai_error() -> None:
    response = client(SOURCE).post(
        _url("/v1/audio/speech"),
        data=b"x" * (SMALL_LIMIT + 1),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"


def test_voice_upload_allows_the_upload_limit_and_no_more() -> None:
    session = client(SOURCE)
    # A prompt well over the small limit reaches Django (which answers for itself).
    fits = session.post(
        _url("/api/v1/voices"), files={"audio": ("prompt.wav", b"\0" * (2 * SMALL_LIMIT))}, timeout=60
    )
    assert fits.status_code != 413
    assert fits.headers["Content-Type"] in (PROBLEM_JSON, "application/json")
    too_big = session.post(
        _url("/api/v1/voices"),
        files={"audio": ("prompt.wav", b"\0" * (UPLOAD_LIMIT + deploy_nginx.MULTIPART_SLACK_BYTES + 1))},
        timeout=60,
    )
    assert too_big.status_code == 413
    assert too_big.headers["Content-Type"] == PROBLEM_JSON
    # The larger limit is only on the upload location.
    other = session.post(
        _url("/api/v1/voices/x"), files={"audio": ("prompt.wav", b"\0" * (2 * SMALL_LIMIT))}, timeout=60
    )
    assert other.status_code == 413


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/api/v1/voice_consents", PROBLEM_JSON),
        ("/v1/audio/voice_consents", "application/json"),
        ("/app/voices/consents/record/", PROBLEM_JSON),
    ],
)
def test_a_consent_recording_allows_the_upload_limit_and_no_more(path: str, content_type: str) -> None:
    """A 30 s recording at 44.1 kHz (2.6 MB of WAV) is over the small limit: it must reach Django."""
    session = client(SOURCE)
    fits = session.post(_url(path), files={"recording": ("c.wav", b"\0" * (2 * SMALL_LIMIT))}, timeout=60)
    assert fits.status_code != 413, fits.text
    too_big = session.post(
        _url(path),
        files={"recording": ("c.wav", b"\0" * (UPLOAD_LIMIT + deploy_nginx.MULTIPART_SLACK_BYTES + 1))},
        timeout=60,
    )
    assert too_big.status_code == 413
    assert too_big.headers["Content-Type"] == content_type
