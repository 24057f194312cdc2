"""Migrations give up on a lock they cannot get, and pods wait for the schema (issue 49, item 3).

Both run the real ``manage.py`` in a subprocess against the test stack's PostgreSQL, on the
test-only app ``tests.migration_lock`` (its own table, never the service's): its 0002 alters
the table, which needs an ACCESS EXCLUSIVE lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.stack import CFG, TestStack

ROOT = Path(__file__).resolve().parents[2]
LOCK_TIMEOUT = 1


def manage(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.migration_lock.settings",
        "TTS_MIGRATION_LOCK_TIMEOUT": str(LOCK_TIMEOUT),
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def at_0001(stack: TestStack, django_db_setup: None) -> Iterator[None]:
    """The test app's table exists and its 0002 is not applied; it is gone again afterwards."""
    done = manage("migrate", "migration_lock", "0001", "--noinput")
    assert done.returncode == 0, done.stderr[-2000:]
    try:
        yield
    finally:
        done = manage("migrate", "migration_lock", "zero", "--noinput")
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_migration_behind_a_lock_gives_up_after_the_lock_timeout(at_0001: None) -> None:
    with psycopg.connect(CFG.database_url) as reader:
        # A long transaction that read the table: the ALTER's lock waits behind it, and every
        # query of the table after the ALTER would wait behind the ALTER.
        reader.execute("SELECT count(*) FROM migration_lock_probe")
        started = time.monotonic()
        done = manage("migrate", "migration_lock", "--noinput", timeout=20)
        elapsed = time.monotonic() - started
        reader.rollback()
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert elapsed < LOCK_TIMEOUT + 15  # the interpreter's and Django's start, then 1 s of waiting
    assert "migration_lock.0002_add_note" in done.stderr
    assert f"lock_timeout of {LOCK_TIMEOUT} s" in done.stderr
    assert "Traceback" not in done.stderr  # one clear line, not a stack
    # Nothing of it stayed: the retry, with the reader gone, applies it.
    again = manage("migrate", "migration_lock", "--noinput")
    assert again.returncode == 0, again.stderr[-2000:]
    with psycopg.connect(CFG.database_url) as conn:
        assert conn.execute("SELECT note FROM migration_lock_probe").fetchall() == []


def test_a_pod_waits_for_the_schema_its_code_needs(at_0001: None) -> None:
    started = time.monotonic()
    waiting = manage("wait_for_schema", "--timeout", "2", "--interval", "0.5")
    assert waiting.returncode == 1, (waiting.stdout[-2000:], waiting.stderr[-2000:])
    assert "migration_lock.0002_add_note" in waiting.stderr
    assert time.monotonic() - started >= 2
    assert manage("migrate", "migration_lock", "--noinput").returncode == 0
    ready = manage("wait_for_schema", "--timeout", "2")
    assert ready.returncode == 0, ready.stderr[-2000:]
    assert "schema is up to date" in ready.stderr + ready.stdout
