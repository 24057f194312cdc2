"""The Celery app, configured from Django settings (CELERY_ namespace)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from celery.app import backends

from webapp.private_apis import CELERY_GET_BACKEND
from webapp.provisioning import (
    PlaceholderSecretError,
    UnwritableFolderError,
    check_worker_can_write,
    refuse_placeholder_secrets,
    warn_if_no_log_folder,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")


class App(Celery):
    """Celery, with the result backend's class looked up once per process.

    Celery keeps a backend that is not thread-safe (ours: the disabled one, as
    PostgreSQL holds the results) per thread, and finding its class scans every
    installed package's entry points. Under ASGI each request's sync code runs
    in a new thread, so every submit paid that scan: about a seventh of a web
    process's CPU under the waiting benchmark. The instance stays per thread.

    ``_get_backend`` is Celery's private method: the override is dropped where
    this Celery has no such name (:func:`drop_overrides_celery_lacks`).
    """

    _backend_class: tuple[Any, str] | None = None

    def _get_backend(self) -> Any:
        if self._backend_class is None:
            found: Any = backends.by_url(self.backend_cls or self.conf.result_backend, self.loader)
            self._backend_class = found  # (class, url): the stubs say a class alone
        backend, url = self._backend_class
        return backend(app=self, url=url)


def drop_overrides_celery_lacks() -> None:
    """Let Celery's own lookup run where it has no ``_get_backend`` to override.

    Run as this module is imported, before any backend is made, in every
    process (web, worker, beat); the error naming Celery's version is logged at
    the process's start (``private_apis.check_all``), once logging is set up.
    """
    if not CELERY_GET_BACKEND.present() and "_get_backend" in vars(App):
        del App._get_backend


drop_overrides_celery_lacks()
app = App("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["webapp.speech", "webapp.housekeeping", "webapp.webhooks"])


@signals.task_prerun.connect
def _reuse_database_connection(task: Any = None, **_: Any) -> None:
    """Before each task, close the connection only if it is stale, as Django does per request.

    Celery's own fix-up would close it around every task (``CELERY_DB_REUSE_MAX`` unset):
    a new PostgreSQL connection per job cost 10-40 ms of dispatch latency on a busy host.
    Here ``CONN_MAX_AGE`` and the health check decide, and a connection that broke
    is replaced (a worker's writes also retry through ``tasks.db_retry``).
    """
    from django.db import close_old_connections

    if task is not None and getattr(task.request, "is_eager", False):
        return  # run in the caller's thread (and maybe its transaction), as Celery's fix-up also skips
    close_old_connections()


@signals.worker_init.connect
def _refuse_folders_it_cannot_write(**_: Any) -> None:
    """A worker that cannot write where its tasks write exits at start, naming the folder, instead
    of failing every job; SystemExit, since Celery logs and ignores a signal handler's Exception."""
    from django.conf import settings

    try:
        check_worker_can_write(settings.TTS_VAR_LAYOUT)
    except UnwritableFolderError as exc:
        raise SystemExit(f"worker: not starting: {exc}") from None


@signals.worker_init.connect
@signals.beat_init.connect
def _refuse_placeholder_secrets(**_: Any) -> None:
    """A node started from an example file's ``CHANGE-ME`` exits at start, naming the secret. A worker
    needs no secret to run, but one it was given must not be a value anyone can read in this repository."""
    try:
        refuse_placeholder_secrets()
    except PlaceholderSecretError as exc:
        raise SystemExit(f"not starting: {exc}") from None


@signals.worker_init.connect
@signals.beat_init.connect
def _say_where_logs_go(**_: Any) -> None:
    """A Celery process needs no secret (it never signs nor hashes API keys; webapp/provisioning.py),
    so it starts without one; it only says once when its log file cannot be written."""
    warn_if_no_log_folder()
