"""Session fixtures: the test stack (PostgreSQL, Redis, workers, gunicorn, Nginx).

Unit tests that need no services simply don't ask for these fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.stack import TestStack


@pytest.fixture(scope="session")
def stack() -> Iterator[TestStack]:
    s = TestStack()
    s.start_data()
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="session")
def django_db_setup(stack: TestStack, django_db_blocker: Any) -> None:
    """Use the test stack's own database (migrated here), not a test_ copy."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        call_command("migrate", "--noinput", verbosity=0)


@pytest.fixture
def synth_worker(stack: TestStack, django_db_setup: None) -> Iterator[Any]:
    """The shared real Celery synthesis worker (piper + espeak queues).

    Started on first use and kept for the session; tests that start workers of
    their own stop it first (``no_session_worker``), so no message goes astray.
    After the test it is given time to settle the jobs it is running: a
    transactional test's teardown truncates every table, and a worker writing a
    job meanwhile deadlocked with it once (the flush failed the test).
    """
    worker = stack.ensure_session_worker()
    yield worker
    _wait_worker_idle(worker, timeout=15)


def _wait_worker_idle(worker: Any, timeout: float) -> None:
    """Until no committed job is running in one of ``worker``'s children (read outside the test's transaction)."""
    import time

    import psutil
    import psycopg

    from tests.stack import CFG

    if worker.process is None or worker.process.poll() is not None:
        return
    try:
        owners = [f"%:{c.pid}" for c in psutil.Process(worker.process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    deadline = time.monotonic() + timeout
    with psycopg.connect(CFG.database_url, autocommit=True) as conn:
        while owners and time.monotonic() < deadline:
            sql = "SELECT count(*) FROM speech_synthesisjob WHERE status = 'running' AND worker LIKE ANY(%s)"
            row = conn.execute(sql, [owners]).fetchone()
            if not row or not row[0]:
                return
            time.sleep(0.1)


@pytest.fixture
def no_session_worker(stack: TestStack) -> None:
    stack.stop_session_worker()


@pytest.fixture(scope="session")
def web(stack: TestStack, django_db_setup: None) -> Iterator[Any]:
    """gunicorn + Nginx (TLS) on the test ports."""
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)
    services = stack.start_web()
    try:
        yield stack
    finally:
        for service in reversed(services):
            stack.stop_service(service)


@pytest.fixture
def builtin_voices(db: None) -> list[str]:
    """The built-in voices of the engines a worker loads by default (TTS_WORKER_ENGINES) as Voice rows
    (a flush between transactional tests removes them). Engines installed beside them (voxcpm,
    which needs a model directory) are synced by the tests that start their workers."""
    from django.conf import settings

    from synth.registry import list_voices
    from webapp.speech.voices import sync_builtin_voices

    voices = list_voices(engines=list(settings.TTS_WORKER_ENGINES))
    sync_builtin_voices(voices)
    return [v.id for v in voices]


# Consent codes flite's voices read and pocketsphinx recognises, for every tenant name the tests
# make ("Tenant 1"-"Tenant 20", "Live tenant 1"-"Live tenant 10"), in slt's and awb's voices.
RECOGNISED_CONSENT_CODES = ("140257", "618394", "905162", "371846", "539071", "738160")


@pytest.fixture
def recognised_consent_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Phrases issued in this process carry the codes above, in turn, instead of random ones.

    The recordings are flite reading the phrase; even with a pause after each digit about one
    random code in two hundred is misheard (a 2 heard as a 0), which would fail a test now and
    then for a reason that is not its own. The product's codes stay random (tests/unit/synth)."""
    import itertools

    from synth import consent

    codes = itertools.cycle(RECOGNISED_CONSENT_CODES)
    monkeypatch.setattr(consent, "new_code", lambda digits=consent.CODE_DIGITS: next(codes))
