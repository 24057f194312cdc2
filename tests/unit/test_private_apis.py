"""The private names of Celery, billiard, Django, DRF and soundfile the site relies on (webapp/private_apis.py).

Each exists in the installed versions (an upgrade that renames one fails here), and
each override falls back to the library's own behaviour when it is gone: the rename
is simulated on the real library object, the real start-up check runs, and the test
reads both the ERROR (library, version, name) and what runs instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest

from webapp import private_apis


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a process that has reported nothing yet."""
    monkeypatch.setattr(private_apis, "_reported", set())
    yield


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def test_every_private_name_exists_in_the_installed_libraries(caplog: pytest.LogCaptureFixture) -> None:
    assert [p.where for p in private_apis.ALL if not p.present()] == []
    with caplog.at_level(logging.ERROR):
        assert private_apis.check_all() == []
    assert errors(caplog) == []


def test_a_missing_name_is_logged_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import soundfile

    monkeypatch.delattr(soundfile, "_ffi")
    with caplog.at_level(logging.ERROR):
        assert private_apis.check_all() == [private_apis.SOUNDFILE_FFI]
        assert private_apis.check_all() == [private_apis.SOUNDFILE_FFI]
    assert errors(caplog) == [
        f"soundfile {metadata.version('soundfile')} has no soundfile._ffi, which "
        "webapp/speech/services/outputs.py (storage_error_code reads the C errno of a failed write) "
        "relies on: a failed audio write is reported as storage_error, a full disk included. "
        "Check that use against this version."
    ]


def test_a_library_that_is_not_installed_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    absent = private_apis.PrivateName("no-such-dist", "no_such_module", "_x", used_by="nothing", without="-")
    with caplog.at_level(logging.ERROR):
        assert not private_apis.check(absent)
    assert errors(caplog) == []


# ----------------------------------------------------------------------------- celery_pool


def _started_pool_class(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Start webapp's TaskPool up to the point where Celery's on_start would fork with ``self.Pool``."""
    from celery.concurrency import prefork

    from webapp.celery_pool import TaskPool

    started: list[Any] = []
    monkeypatch.setattr(prefork.TaskPool, "on_start", lambda self: started.append(self.Pool))
    TaskPool(limit=1).on_start()
    return started[0]


def test_the_pool_runs_its_override_while_celery_has_event_process_exit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from webapp import celery_pool

    with caplog.at_level(logging.ERROR):
        assert _started_pool_class(monkeypatch) is celery_pool.AsynPool
    assert errors(caplog) == []


def test_the_pool_falls_back_when_celery_renames_event_process_exit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from celery.concurrency import asynpool

    monkeypatch.delattr(asynpool.AsynPool, "_event_process_exit")
    with caplog.at_level(logging.ERROR):
        assert _started_pool_class(monkeypatch) is asynpool.AsynPool  # Celery's own pool
    [error] = errors(caplog)
    assert f"celery {metadata.version('celery')} has no " in error
    assert "celery.concurrency.asynpool.AsynPool._event_process_exit" in error
    assert "Celery's own prefork pool" in error


def test_the_pools_flush_keeps_no_busy_marks_when_billiard_renames_write_to(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without ``ApplyResult._write_to`` the flush is Celery's own: no child is marked busy again."""
    import types

    from billiard import pool

    from webapp import celery_pool

    running = types.SimpleNamespace(
        _write_to=types.SimpleNamespace(inqW_fd=7), _accepted=True, ready=lambda: False
    )
    holder: Any = types.SimpleNamespace(_cache={1: running})
    assert celery_pool.AsynPool._children_running_a_task(holder) == {7}
    monkeypatch.delattr(pool.ApplyResult, "_write_to")
    assert celery_pool.AsynPool._children_running_a_task(holder) == set()
    with caplog.at_level(logging.ERROR):
        assert private_apis.check_all() == [private_apis.POOL_RUNNING_JOB_CHILD]
    [error] = errors(caplog)
    assert "billiard.pool.ApplyResult._write_to" in error and "wait behind it" in error


# ----------------------------------------------------------------------------- webapp/celery.py


def test_the_app_falls_back_when_celery_renames_get_backend(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from celery.app.base import Celery

    from webapp import celery as celery_module

    # A Celery release that renamed the method, and its caller with it.
    stock = Celery._get_backend  # type: ignore[attr-defined]  # celery-types omit the private method
    made: list[Any] = []

    def make_backend(self: Any) -> Any:
        made.append(self)
        return stock(self)

    monkeypatch.delattr(Celery, "_get_backend")
    monkeypatch.setattr(Celery, "_make_backend", make_backend, raising=False)
    monkeypatch.setattr(Celery, "backend", property(lambda self: self._make_backend()))
    monkeypatch.setattr(celery_module.App, "_get_backend", celery_module.App._get_backend)  # put back after

    with caplog.at_level(logging.ERROR):
        celery_module.drop_overrides_celery_lacks()
        assert private_apis.check_all() == [private_apis.CELERY_GET_BACKEND]
    [error] = errors(caplog)
    assert f"celery {metadata.version('celery')} has no celery.app.base.Celery._get_backend" in error
    assert "_get_backend" not in vars(celery_module.App)

    app = celery_module.App("fallback-test", set_as_current=False)
    backend = app.backend
    assert type(backend).__name__ == "DisabledBackend"  # a working backend, from Celery's own lookup
    assert made == [app]
    assert app._backend_class is None  # the override's per-process cache never ran


def test_the_app_keeps_its_override_while_celery_has_get_backend() -> None:
    from webapp import celery as celery_module

    celery_module.drop_overrides_celery_lacks()
    assert "_get_backend" in vars(celery_module.App)


# ----------------------------------------------------------------------------- the exit hook


def test_the_exit_hook_falls_back_when_billiard_renames_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import billiard.pool as pool

    from webapp.speech.runtime import recycling

    monkeypatch.delattr(pool, "mem_rss")
    with caplog.at_level(logging.ERROR):
        assert recycling.install_exit_hook() is False
    assert not hasattr(pool, "mem_rss")  # nothing installed under the old name
    [error] = errors(caplog)
    assert f"billiard {metadata.version('billiard')} has no billiard.pool.mem_rss" in error
    assert "worker_max_tasks_per_child and worker_max_memory_per_child" in error


def test_rss_reading_falls_back_without_mem_rss(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that cannot hook billiard's reading keeps no limits of its own: it never says it
    leaves when it cannot, and Celery's own limits (billiard's real reading) replace it."""
    import billiard.pool as pool

    from webapp.speech.runtime import recycling

    monkeypatch.delattr(pool, "mem_rss")
    with caplog.at_level(logging.ERROR):
        health = recycling.health_for_child()
    assert len(errors(caplog)) == 1
    assert health.policy == recycling.RecyclePolicy()
    health.set_baseline(rss_mb=100.0)
    assert health.check(rss_mb=10**6, tasks_done=10**6, now=health.started_at + 10**9) is None


def test_a_child_with_the_exit_hook_keeps_the_settings_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    import billiard.pool as pool

    from webapp.speech.runtime import recycling

    monkeypatch.setattr(pool, "mem_rss", pool.mem_rss)  # type: ignore[attr-defined]  # put back after
    health = recycling.health_for_child()
    assert health.policy == recycling.RecyclePolicy.from_settings()
    assert getattr(pool.mem_rss, "_tts_hook", False)  # type: ignore[attr-defined]


def test_voxcpms_model_module_is_found_through_its_importer_and_left_out_of_the_start_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = private_apis.VOXCPM_MODEL_MODULES
    if name.version() is None:
        pytest.skip("voxcpm is not installed")
    assert name.present() and name.checked_on == "2.0.3"
    monkeypatch.setattr(private_apis, "ALL", (name,))
    monkeypatch.setattr(private_apis.PrivateName, "present", lambda self: False)
    assert private_apis.check_all() == []  # a model's import is never run at a web process's start
