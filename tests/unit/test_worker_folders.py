"""A Celery worker that cannot write where its tasks write refuses to start, naming the folder.

A real ``celery worker`` process, as the app user when these tests run as root (root may write
anywhere); the check runs before the worker connects to anything, so no stack is needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.privileges import app_user, as_user

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def var_dir() -> Iterator[Path]:
    """A var/ the app user can enter but not write, as `make run` left it before issue 32: the
    app's folders are its own, the cache folder is missing (pytest's tmp_path is private to root)."""
    var = Path(tempfile.mkdtemp(prefix="tts-worker-folders-"))
    var.chmod(0o755)
    user = app_user()
    for name in ("media", "tmp", "run/jobs", "home"):
        (var / name).mkdir(parents=True)
        for part in [var / name, *(var / name).parents]:
            if user is not None and part != var and var in part.parents:
                os.chown(part, user.pw_uid, user.pw_gid)
    if user is None:
        var.chmod(0o555)  # not root: the modes alone keep us out
    yield var
    var.chmod(0o755)
    shutil.rmtree(var, ignore_errors=True)


def _as_app_user() -> dict[str, Any]:
    return as_user(app_user()) if os.geteuid() == 0 else {}


def test_a_worker_that_cannot_write_its_cache_folder_exits_at_start_naming_it(var_dir: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TTS_", "DJANGO_"))},
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "TTS_VAR_DIR": str(var_dir),
        "TTS_WORKER_ROLE": "analysis",
        "TTS_LOG_TO_FILE": "0",
        "HOME": str(var_dir / "home"),
        # Nothing listens here: the worker must stop before it tries.
        "REDIS_URL": "redis://127.0.0.1:9/0",
    }
    command = [str(Path(sys.executable).parent / "celery"), "-A", "webapp", "worker", "-Q", "analysis"]
    worker = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **_as_app_user(),
    )
    try:
        output = worker.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        worker.kill()
        pytest.fail(f"the worker started (and waits for its broker):\n{worker.communicate()[0][-3000:]}")
    assert worker.returncode == 1, output[-3000:]
    cache = var_dir / "cache"
    assert f"worker: not starting: {'tts-app' if os.geteuid() == 0 else ''}" in output, output[-3000:]
    assert f"cannot write {cache} (missing; {var_dir} refuses it)" in output, output[-3000:]
    assert "prepare_var" in output
    # It said so before connecting to the broker, not after a job failed.
    assert "Cannot connect" not in output and "ready." not in output, output[-3000:]
