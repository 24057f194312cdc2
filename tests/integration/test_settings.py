"""Production settings pass Django's deployment checks with nothing silenced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _production_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TTS_"))}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "x7!Kq2#pL9vR$mZ4wT8^bN3&cF6*hJ1@dS5%gY0(eU-aW+iO=lP" * 2,
            "TTS_API_KEY_SECRET": "another-long-random-secret-for-api-keys-0123456789abcdef",
            "DJANGO_ALLOWED_HOSTS": "tts.example.com",
            "TTS_VAR_DIR": str(tmp_path),
            "TTS_LOG_TO_FILE": "0",
        }
    )
    return env


def test_it_passes_check_deploy_in_production_mode(tmp_path: Path) -> None:
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=_production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)" in result.stdout


def test_it_silences_no_checks() -> None:
    from django.conf import settings

    assert settings.SILENCED_SYSTEM_CHECKS == []


def test_debug_mode_fails_check_deploy(tmp_path: Path) -> None:
    # The check must be able to fail, or the test above proves nothing.
    env = _production_env(tmp_path)
    env["DJANGO_DEBUG"] = "1"
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode != 0
    assert "security.W018" in result.stdout + result.stderr


def test_debug_is_off_unless_asked_for(tmp_path: Path) -> None:
    env = _production_env(tmp_path)
    del env["DJANGO_DEBUG"]
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_debug_pages_are_shown_to_loopback_clients_only(settings: Any) -> None:
    from django.test import Client

    # The suite's settings load with DJANGO_DEBUG=1 (tests/settings.py), so the guard is
    # installed; pytest-django turns DEBUG off while tests run, as Django's runner does.
    assert "webapp.debug_pages.LoopbackDebugPagesMiddleware" in settings.MIDDLEWARE
    settings.DEBUG = True
    local = Client(REMOTE_ADDR="127.0.0.1").get("/no-such-page/")
    remote = Client(REMOTE_ADDR="203.0.113.7").get("/no-such-page/")
    assert local.status_code == remote.status_code == 404
    assert "URLconf" in local.content.decode()  # Django's debug page, listing the URL patterns
    page = remote.content.decode()
    assert "URLconf" not in page and "admin/" not in page and "redis" not in page.lower()
    assert "404 Not found" in page


def test_plain_text_debug_pages_are_replaced_for_remote_clients_too(settings: Any) -> None:
    """Django answers a client that does not take HTML with a plain-text debug page: settings included."""
    from django.test import Client

    settings.DEBUG = True
    for address, shown in (("127.0.0.1", True), ("203.0.113.7", False)):
        # A port that is not a number: DisallowedHost, Django's 400 debug page (as text).
        response = Client(REMOTE_ADDR=address).get(
            "/healthz", HTTP_HOST="localhost:x", HTTP_ACCEPT="text/plain"
        )
        assert response.status_code == 400
        body = response.content.decode()
        assert ("DisallowedHost" in body) is shown, body[:300]
        if not shown:
            assert "REDIS_URL" not in body and "SECRET_KEY" not in body and "Request Method" not in body
            assert "400" in body and response["Content-Type"].startswith("text/html")
