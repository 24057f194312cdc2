"""Helpers for the admin console tests: a staff client, committed rows, waiting on jobs; and for
the backup tests, ``make backup``/``make restore`` with settings, an operator's age key."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from deploy import backup
from deploy.provision import StackConfig
from tests.integration.api.conftest import live_tenant, make_tenant  # noqa: F401 (fixtures)

Make = Callable[..., tuple[int, str]]
# Every setting `make backup` reads, unset before each run: a test sets the ones it means.
BACKUP_SETTINGS = (
    "TTS_PG_PASSWORD",
    "TTS_BACKUP_RECIPIENTS",
    "TTS_BACKUP_RECIPIENTS_FILE",
    "TTS_BACKUP_ALLOW_CLEAR",
    "TTS_BACKUP_KEEP",
    "TTS_BACKUP_DIR",
    "TTS_BACKUP_MIN_FREE_BYTES",
)

STAFF_IP = "203.0.113.7"


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    """The admin pages name hashed static files, as in production: that needs the manifest."""
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)


def staff_client(username: str = "operator") -> tuple[Client, Any]:
    """A signed-in superuser whose requests come from STAFF_IP, as Nginx's X-Real-IP says."""
    from django.contrib.auth.models import User

    user = User.objects.create_superuser(username, f"{username}@example.test", "pw-operator-123")
    client = Client(HTTP_X_REAL_IP=STAFF_IP)
    client.force_login(user)
    return client, user


def run_action(client: Client, model: str, action: str, ids: list[Any], **extra: str) -> Any:
    """POST a changelist action, as the admin's action form does."""
    return client.post(
        f"/admin/{model}/",
        {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra},
    )


def job_status(job_id: Any) -> str:
    from webapp.speech.models import SynthesisJob

    return str(SynthesisJob.objects.filter(id=job_id).values_list("status", flat=True).get())


@pytest.fixture
def operator_key(tmp_path: Path) -> tuple[Path, str]:
    """An age key pair outside var/: (identity file, public key)."""
    identity = tmp_path / "operator" / "backup.key"
    identity.parent.mkdir()
    subprocess.run(["age-keygen", "-o", str(identity)], check=True, capture_output=True)
    public = subprocess.run(["age-keygen", "-y", str(identity)], check=True, capture_output=True, text=True)
    return identity, public.stdout.strip()


@pytest.fixture
def backups(stack: Any) -> Path:
    """The stack's backup folder, without archives of earlier tests."""
    folder = Path(stack.cfg.path("backups"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("tts-backup-*"):
        old.unlink()
    return folder


@pytest.fixture
def make(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Make:
    """``make backup``/``make restore`` against a var/ and PostgreSQL port, with extra settings."""

    def run(argv: list[str], cfg: StackConfig, **env: str) -> tuple[int, str]:
        for name in BACKUP_SETTINGS:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("TTS_VAR_DIR", str(cfg.var_dir))
        monkeypatch.setenv("TTS_PG_PORT", str(cfg.pg_port))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        rc = backup.main(argv)
        out = capsys.readouterr()
        return rc, out.out + out.err

    return run
