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
def synth_worker(stack: TestStack, django_db_setup: None) -> Any:
    """The shared real Celery synthesis worker (piper + espeak queues).

    Started on first use and kept for the session; tests that start workers of
    their own stop it first (``no_session_worker``), so no message goes astray.
    """
    return stack.ensure_session_worker()


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
    """The built-in voices as Voice rows (a flush between transactional tests removes them)."""
    from synth.registry import list_voices
    from webapp.speech.services.voices import sync_builtin_voices

    voices = list_voices()
    sync_builtin_voices(voices)
    return [v.id for v in voices]
