"""Who may write what under var/ once `make run`'s provisioning ran as root, and what a root fallback says."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import privileges
from deploy.provision import StackConfig, prepare_var
from webapp.provisioning import VarLayout

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop happens as root only")


@pytest.fixture
def cfg() -> Iterator[StackConfig]:
    """A var/ outside pytest's private tmp_path, so the app user can reach it as in `make run`."""
    var = Path(tempfile.mkdtemp(prefix="tts-privileges-"))
    var.chmod(0o755)
    yield StackConfig(var_dir=var, pg_port=1, redis_port=2, http_port=3, https_port=4, name="unit")
    shutil.rmtree(var, ignore_errors=True)


def _provision(cfg: StackConfig) -> None:
    prepare_var(cfg)
    privileges.secure_var_dir(cfg)


@as_root
def test_every_folder_a_worker_writes_belongs_to_the_app_user(cfg: StackConfig) -> None:
    _provision(cfg)
    layout = VarLayout.from_env({"TTS_VAR_DIR": str(cfg.var_dir)})
    for folder in layout.worker_folders:
        assert (folder.owner(), folder.group()) == (privileges.APP_SYSTEM_USER,) * 2, folder


@as_root
def test_nothing_under_var_is_writable_by_the_app_group_that_nginx_shares(cfg: StackConfig) -> None:
    """Nginx's workers are in the app user's group to read audio: the group may read, never write."""
    _provision(cfg)
    privileges.secure_var_dir(cfg)  # a second start, over what the first one left
    group_writable = [
        str(path)
        for path in [cfg.var_dir, *cfg.var_dir.rglob("*")]
        if path.stat().st_mode & stat.S_IWGRP and path.group() == privileges.APP_SYSTEM_USER
    ]
    assert group_writable == []


def test_a_root_fallback_is_loud_and_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    private = tmp_path / "private"
    (private / "checkout").mkdir(parents=True)
    private.chmod(0o700)
    monkeypatch.setattr(privileges, "PROJECT_ROOT", private / "checkout")
    monkeypatch.setattr(privileges, "app_user", lambda: privileges.pwd.getpwnam("nobody"))
    assert privileges.process_user.__wrapped__() is None
    err = capsys.readouterr().err
    assert "WARNING" in err and "AS ROOT" in err, err
    assert f"read the project in {private / 'checkout'}" in err
    assert "Move the checkout" in err and "rm -rf .venv" in err, err
