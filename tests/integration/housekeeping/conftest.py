"""Fixtures for the housekeeping tests: a controlled clock, a private MEDIA_ROOT, a tenant."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.stack import CFG, TestStack


def copy_rows(model: Any, template_pk: Any, n: int, overrides: dict[str, str]) -> None:
    """``n`` copies of one row of ``model`` in one statement (INSERT ... SELECT over
    ``generate_series(1, n) AS n``): months of history in seconds. ``overrides`` gives the SQL
    of each column that differs from the template's (it may use ``n``, the copy's number)."""
    from django.db import connection

    table = model._meta.db_table
    columns = [str(f.column) for f in model._meta.concrete_fields]
    assert set(overrides) <= set(columns), set(overrides) - set(columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"SELECT {', '.join(overrides.get(c, c) for c in columns)} FROM {table}, "
            f"generate_series(1, %s) AS n WHERE {model._meta.pk.column} = %s",
            [n, template_pk],
        )
        cursor.execute(f"ANALYZE {table}")


class Clock:
    """django.utils.timezone.now, under the test's control (services call it too)."""

    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> dt.datetime:
        self.now += dt.timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock(dt.datetime.now(dt.UTC).replace(microsecond=0))
    with mock.patch("django.utils.timezone.now", c):
        yield c


@pytest.fixture
def media(settings: Any, stack: TestStack) -> Iterator[Path]:
    """A MEDIA_ROOT of this test's own inside the test stack's media folder (real files).

    Private, so a sweep never sees files of other tests that share the stack.
    """
    root = CFG.path("media", f"hk-{uuid.uuid4().hex[:12]}")
    root.mkdir(parents=True)
    var_tmp = CFG.path("tmp", root.name)
    settings.MEDIA_ROOT = root
    settings.TTS_TEMP_DIRS = [str(root / "tmp"), str(var_tmp)]
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(var_tmp, ignore_errors=True)


@pytest.fixture
def lock_free(stack: TestStack) -> Iterator[None]:
    """No housekeeping lock left over from an earlier test."""
    r = stack.redis_client()
    for key in r.scan_iter(match="tts:housekeeping:lock:*"):
        r.delete(key)
    yield


# Test voices use an engine no worker serves, so their messages wait in this
# Redis list, where a test can count them, whatever workers the session runs.
PROBE_ENGINE = "hkprobe"
PROBE_QUEUE = f"synth.{PROBE_ENGINE}"


@pytest.fixture
def isolated(db: None) -> None:
    """Jobs run over whole tables: hide rows other tests on this stack committed.

    In a `db` test the deletes roll back with the test; a transactional test
    flushes every table afterwards anyway.
    """
    from webapp.housekeeping.models import HousekeepingRun
    from webapp.speech.models import IdempotencyKey, SynthesisJob, Voice

    for model in (IdempotencyKey, SynthesisJob, Voice, HousekeepingRun):
        model.objects.all().delete()


@pytest.fixture
def probe_queue(stack: TestStack) -> Iterator[str]:
    r = stack.redis_client()
    r.delete(PROBE_QUEUE)
    yield PROBE_QUEUE
    r.delete(PROBE_QUEUE)


@pytest.fixture
def org(isolated: None) -> Any:
    from webapp.tenants.models import Organization
    from webapp.tenants.services import default_plan

    suffix = uuid.uuid4().hex[:8]
    # default_plan() recreates the plan a transactional test's flush removed.
    return Organization.objects.create(name=f"HK {suffix}", slug=f"hk-{suffix}", plan=default_plan())


@pytest.fixture
def voice(isolated: None) -> Any:
    from webapp.speech.models import Voice

    return Voice.objects.create(
        voice_id=f"hk-test-{uuid.uuid4().hex[:8]}",
        name="HK test",
        engine=PROBE_ENGINE,
        language="en_US",
        sample_rate=22050,
    )


def write_file(path: Path, size: int = 1000, mtime: dt.datetime | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    if mtime is not None:
        ts = mtime.timestamp()
        os.utime(path, (ts, ts))
    return path


@pytest.fixture
def make_audio_job(org: Any, voice: Any, media: Path) -> Callable[..., Any]:
    """A succeeded job with a real audio file, finished ``age`` seconds ago and expiring at ``expires_at``."""
    from webapp.speech.models import SynthesisJob

    def make(expires_at: dt.datetime, size: int = 4000, **fields: Any) -> Any:
        job_id = uuid.uuid4()
        relative = f"audio/{org.id}/{job_id}.wav"
        write_file(media / relative, size)
        return SynthesisJob.objects.create(
            id=job_id,
            organization=org,
            voice=voice,
            voice_name=voice.voice_id,
            engine=voice.engine,
            text="hello",
            text_chars=5,
            format="wav",
            status=SynthesisJob.Status.SUCCEEDED,
            finished_at=expires_at - dt.timedelta(days=7),
            expires_at=expires_at,
            audio_path=relative,
            audio_bytes=size,
            **fields,
        )

    return make


def submit(org: Any, voice: Any, text: str = "Hello there.") -> Any:
    """A real submit (reservation included); in a `db` test its on_commit dispatch never runs."""
    from webapp.speech import lifecycle

    job, created = lifecycle.submit_job(
        org,
        lifecycle.JobRequest(
            text=text, voice=voice, format="wav", sample_rate=None, params={}, billable_chars=len(text)
        ),
    )
    assert created
    return job
