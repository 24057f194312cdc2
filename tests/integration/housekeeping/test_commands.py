"""manage.py housekeeping: list, run one or all, refuse unknown names."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.integration.housekeeping.conftest import Clock
from webapp.housekeeping import locks
from webapp.housekeeping.catalog import JOBS
from webapp.speech.models import SynthesisJob


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("housekeeping", *args, stdout=out)
    return out.getvalue()


def test_list_names_every_job() -> None:
    listed = [line.split()[0] for line in run("--list").splitlines()]
    assert listed == sorted(JOBS)


def test_a_job_runs_by_hand(clock: Clock, media: Path, make_audio_job: Any, lock_free: None) -> None:
    job = make_audio_job(clock.now - dt.timedelta(hours=1), size=321)
    assert run("expire_audio").startswith("expire_audio: ok bytes_released=321 expired=1 duration_ms=")
    assert SynthesisJob.objects.get(id=job.id).status == SynthesisJob.Status.EXPIRED
    lock = locks.RedisLock("expire_audio", 30)
    assert lock.acquire()
    try:
        assert run("expire_audio") == "expire_audio: skipped (another run holds the lock)\n"
    finally:
        lock.release()


def test_all_runs_every_job(isolated: None, media: Path, lock_free: None) -> None:
    lines = run("--all").splitlines()
    assert [line.split(":")[0] for line in lines] == sorted(JOBS)
    assert all(": ok " in line for line in lines), lines


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(CommandError, match="unknown job"):
        run("expire_everything")
    with pytest.raises(CommandError, match="--all"):
        run()
