"""Importing the settings writes nothing; `manage.py prepare_var` creates the secrets and folders.

Each check runs in a child process with the environment a fresh clone has (none of
our variables) and ``TTS_VAR_DIR`` pointing at a folder that does not exist yet, so
nothing of this checkout's own var/ is used. The trees are compared before and after:
``manage.py check``, ``makemigrations --check`` (lint, mypy's Django plugin) and a
plain import must leave both untouched, so they also run on a read-only filesystem.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from deploy import provision
from deploy.provision import StackConfig, StackError

ROOT = Path(__file__).resolve().parents[2]

SECRETS = ("django_secret_key", "api_key_secret")
FOLDERS = ("log", "media", "static", "run", "run/jobs", "voices", "tmp", "cache")


def _fresh_clone_env(var_dir: Path, **extra: str) -> dict[str, str]:
    """The machine's environment without any of the service's settings, var/ elsewhere."""
    ours = ("DJANGO_", "TTS_", "DATABASE_", "REDIS_URL", "CELERY_", "PROMETHEUS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    # Nothing listens on port 1: a database call fails at once instead of waiting.
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "webapp.settings",  # as manage.py and mypy's Django plugin set it
            "TTS_VAR_DIR": str(var_dir),
            "DATABASE_URL": "postgres://tts:x@127.0.0.1:1/tts",
        }
    )
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def _tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its mode and size (folders: size 0)."""
    found: dict[str, tuple[int, int]] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = [d for d in dirnames if (rel / d).as_posix() not in skip]
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            info = path.lstat()
            found[(rel / name).as_posix()] = (info.st_mode, 0 if path.is_dir() else info.st_size)
    return found


def _repo_var() -> tuple[set[str], dict[str, tuple[int, int]]]:
    """What settings falling back to the checkout's var/ would create: entries at its top
    and secrets. Not deeper: a running `make run` writes its logs, and the test stacks
    (var/test*) belong to test runs that may be writing right now."""
    var = ROOT / "var"
    top = {p.name for p in var.iterdir() if not p.name.startswith("test")} if var.is_dir() else set()
    return top, _tree(var / "secrets")


@pytest.mark.parametrize(
    "command",
    [
        ["-c", "import django; django.setup(); from django.conf import settings; print(settings.LOGGING)"],
        ["manage.py", "check"],
        ["manage.py", "makemigrations", "--check", "--dry-run"],
    ],
    ids=["import", "check", "makemigrations"],
)
def test_importing_settings_creates_no_file_or_folder(tmp_path: Path, command: list[str]) -> None:
    var_dir = tmp_path / "var"
    repo_var = _repo_var()
    result = _run(command, _fresh_clone_env(var_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _tree(tmp_path) == {}, "the settings wrote under TTS_VAR_DIR"
    assert _repo_var() == repo_var, "the settings wrote into the checkout's var/"


@pytest.mark.parametrize("entry", ["webapp.wsgi", "webapp.asgi"])
def test_serving_refuses_to_start_without_the_secret_key(tmp_path: Path, entry: str) -> None:
    result = _run(["-c", f"import {entry}"], _fresh_clone_env(tmp_path / "var"))
    assert result.returncode != 0
    assert "SECRET_KEY is missing" in result.stderr
    assert "manage.py prepare_var" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr
    assert str(tmp_path / "var" / "secrets" / "django_secret_key") in result.stderr
    assert _tree(tmp_path) == {}


def test_serving_refuses_to_start_without_the_api_key_secret(tmp_path: Path) -> None:
    env = _fresh_clone_env(tmp_path / "var", DJANGO_SECRET_KEY="k" * 60)
    result = _run(["-c", "import webapp.wsgi"], env)
    assert result.returncode != 0
    assert "API_KEY_HMAC_SECRET is missing" in result.stderr
    assert "TTS_API_KEY_SECRET" in result.stderr and "manage.py prepare_var" in result.stderr
    assert "SECRET_KEY is missing" not in result.stderr.replace("API_KEY_HMAC_SECRET is missing", "")


@pytest.mark.parametrize("entry", ["webapp.wsgi", "webapp.asgi"])
def test_serving_refuses_a_secret_left_at_the_examples_placeholder(tmp_path: Path, entry: str) -> None:
    """deploy/k8s/secret.example.yaml ships CHANGE-ME: a pod started from it unedited must not serve."""
    env = _fresh_clone_env(tmp_path / "var", DJANGO_SECRET_KEY="CHANGE-ME", TTS_API_KEY_SECRET="a" * 60)
    result = _run(["-c", f"import {entry}"], env)
    assert result.returncode != 0
    assert "SECRET_KEY is a placeholder" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr


def test_a_celery_worker_refuses_a_placeholder_secret_before_it_connects(tmp_path: Path) -> None:
    env = _fresh_clone_env(
        tmp_path / "var",
        DJANGO_SECRET_KEY="k" * 60,
        TTS_API_KEY_SECRET="change-me",
        REDIS_URL="redis://127.0.0.1:1/0",  # nothing listens: it would fail to connect, had it tried
        TTS_LOG_TO_FILE="0",
    )
    result = _run(["-m", "celery", "-A", "webapp", "worker", "--pool", "solo", "-Q", "nothing"], env)
    assert result.returncode != 0
    assert "API_KEY_HMAC_SECRET is a placeholder" in result.stderr
    assert "Cannot connect to redis" not in result.stderr


def test_hashing_an_api_key_without_its_secret_names_the_fix() -> None:
    from webapp.provisioning import MissingSecretError
    from webapp.tenants.services import hash_secret

    with override_settings(API_KEY_HMAC_SECRET=""), pytest.raises(MissingSecretError, match="prepare_var"):
        hash_secret("tts_abc")


def test_serving_on_secrets_from_the_environment_needs_no_files(tmp_path: Path) -> None:
    env = _fresh_clone_env(tmp_path / "var", DJANGO_SECRET_KEY="k" * 60, TTS_API_KEY_SECRET="a" * 60)
    result = _run(["-c", "import webapp.wsgi"], env)
    assert result.returncode == 0, result.stderr
    # TTS_LOG_TO_FILE is on by default: without its folder the process logs to stderr only, and says so.
    assert "logging to stderr only" in result.stderr and "manage.py prepare_var" in result.stderr
    assert _tree(tmp_path) == {}


def test_prepare_var_creates_the_secrets_and_folders_then_serving_starts(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    env = _fresh_clone_env(var_dir, DATABASE_POOL_SIZE="0")
    result = _run(["manage.py", "prepare_var"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in SECRETS:
        path = var_dir / "secrets" / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        assert len(path.read_text().strip()) >= 50, name
        assert f"created {path}" in result.stdout
    assert stat.S_IMODE((var_dir / "secrets").stat().st_mode) == 0o700
    for folder in FOLDERS:
        assert (var_dir / folder).is_dir(), folder
    secrets = {name: (var_dir / "secrets" / name).read_text() for name in SECRETS}
    tree = _tree(tmp_path, skip=("var/log",))

    again = _run(["manage.py", "prepare_var"], env)  # its log lines now go to var/log/django.log
    assert again.returncode == 0, again.stderr
    assert "nothing to create" in again.stdout
    assert _tree(tmp_path, skip=("var/log",)) == tree
    assert {name: (var_dir / "secrets" / name).read_text() for name in SECRETS} == secrets

    code = (
        "import webapp.wsgi, webapp.asgi, logging; from django.conf import settings;"
        "logging.getLogger('webapp').warning('to the file');"
        "print(settings.SECRET_KEY); print(settings.API_KEY_HMAC_SECRET)"
    )
    served = _run(["-c", code], env)
    assert served.returncode == 0, served.stderr
    assert served.stdout.split() == [secrets["django_secret_key"].strip(), secrets["api_key_secret"].strip()]
    assert "logging to stderr only" not in served.stderr
    assert "to the file" in (var_dir / "log" / "django.log").read_text()


def test_prepare_var_creates_no_file_for_a_secret_given_in_the_environment(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    result = _run(["manage.py", "prepare_var"], _fresh_clone_env(var_dir, DJANGO_SECRET_KEY="k" * 60))
    assert result.returncode == 0, result.stderr
    assert not (var_dir / "secrets" / "django_secret_key").exists()
    assert (var_dir / "secrets" / "api_key_secret").exists()


def test_the_stack_reads_its_passwords_and_provisioning_creates_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith(("DJANGO_", "TTS_", "DATABASE_", "REDIS_URL"))]:
        monkeypatch.delenv(name)
    cfg = StackConfig(
        var_dir=tmp_path / "var", pg_port=1, redis_port=2, http_port=3, https_port=4, name="unit"
    )
    with pytest.raises(StackError, match="pg_password"):
        cfg.database_url  # noqa: B018 -- reading it is the point
    assert _tree(tmp_path) == {}, "reading a password created it"
    provision.prepare_var(cfg)
    for name in ("pg_password", "pg_admin_password", "redis_password", *SECRETS):
        assert stat.S_IMODE(cfg.path("secrets", name).stat().st_mode) == 0o600, name
    for folder in FOLDERS:
        assert cfg.path(folder).is_dir(), folder
    assert cfg.pg_password == cfg.path("secrets", "pg_password").read_text().strip()
