"""Static files from the collected folder: hashed names immutable for a year, gzip for text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.nginx_helpers import HSTS, client
from tests.stack import CFG

IMMUTABLE = "public, max-age=31536000, immutable"


@pytest.fixture(scope="module")
def manifest(web: Any) -> dict[str, str]:
    """collectstatic with ManifestStaticFilesStorage (what production runs), then its name map."""
    from django.core.management import call_command
    from django.test import override_settings

    storages = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    with override_settings(STORAGES=storages):
        call_command("collectstatic", "--noinput", verbosity=0)
    paths: dict[str, str] = json.loads(CFG.path("static", "staticfiles.json").read_text())["paths"]
    return paths


def _url(path: str) -> str:
    return f"https://127.0.0.1:{CFG.https_port}/static/{path}"


def test_hashed_file_is_immutable_with_security_headers(manifest: dict[str, str]) -> None:
    hashed = manifest["admin/css/base.css"]
    assert hashed != "admin/css/base.css"
    response = client().get(_url(hashed), timeout=20)
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == IMMUTABLE
    assert response.headers["Strict-Transport-Security"] == HSTS
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Type"].startswith("text/css")
    # Text is compressed on the way (requests asks for gzip and decodes it).
    assert response.headers["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response.headers["Vary"]
    assert response.content == CFG.path("static", hashed).read_bytes()


def test_javascript_is_gzipped_and_images_are_not(manifest: dict[str, str]) -> None:
    session = client()
    js = session.get(_url(manifest["admin/js/core.js"]), timeout=20)
    assert js.status_code == 200 and js.headers["Content-Encoding"] == "gzip"
    image = next(v for k, v in manifest.items() if k.endswith(".png"))
    png = session.get(_url(image), timeout=20)
    assert png.status_code == 200
    assert "Content-Encoding" not in png.headers
    assert png.headers["Cache-Control"] == IMMUTABLE


def test_unhashed_name_must_revalidate(manifest: dict[str, str]) -> None:
    response = client().get(_url("admin/css/base.css"), timeout=20)
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["Strict-Transport-Security"] == HSTS


def test_missing_hashed_name_is_a_plain_404_not_cached_forever(manifest: dict[str, str]) -> None:
    response = client().get(_url("admin/css/nothing.0123456789ab.css"), timeout=20)
    assert response.status_code == 404
    assert "immutable" not in response.headers.get("Cache-Control", "")
    assert response.headers["Strict-Transport-Security"] == HSTS
