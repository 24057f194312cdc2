"""Every private name of a third-party library the site relies on, and the check made at start.

A private name (a leading underscore) can be renamed in any release. When the
code that overrides or reads one keeps running after a rename, the behaviour
it added silently stops. Each name is listed here once: the library, the
object that holds it, the name, our code that depends on it and what runs
without it. At start (``check_all``: Celery's ``worker_init`` and
``beat_init``, and the ASGI application's import) a missing name logs one
ERROR naming the library, its installed version and the name; the code that
depends on it asks :func:`check` (or :meth:`PrivateName.present`) itself and
falls back to the library's stock behaviour. ``tests/unit/test_private_apis.py``
checks that every name exists in the installed versions, and each fallback.

This module sits low in the site's layers: it imports no part of the site,
and a library only when a name of it is checked. A name whose module cannot be imported
the ordinary way names the function that imports it (``importer``): voxcpm's model module,
which the VoxCPM engine imports without the package's ``__init__``
(synth/engines/voxcpm_package.py). ``checked_on`` is the version a use was last read against.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from celery import signals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrivateName:
    library: str  # the distribution, as pip names it: its version goes in the error
    owner: str  # "module" or "module:Class": the library object that holds the name
    name: str
    used_by: str  # our code that overrides or reads it
    without: str  # what runs when it is missing
    # For an attribute set on instances: owner -> an instance to look at.
    instance: Callable[[Any], Any] | None = None
    # "module:function" that imports the owner's module (given its name), where a plain import cannot.
    importer: str | None = None
    checked_on: str | None = None  # the library's version the use was checked against

    @property
    def where(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name}"

    def holder(self) -> Any:
        module_name, _, qualname = self.owner.partition(":")
        if self.importer is not None:
            where, _, function = self.importer.partition(":")
            obj: Any = getattr(importlib.import_module(where), function)(module_name)
        else:
            obj = importlib.import_module(module_name)
        for part in qualname.split(".") if qualname else ():
            obj = getattr(obj, part)
        return self.instance(obj) if self.instance is not None else obj

    def present(self) -> bool:
        try:
            return hasattr(self.holder(), self.name)
        except Exception:  # the owner itself moved
            return False

    def version(self) -> str | None:
        """The installed version, or None where the library is not installed (nor used)."""
        try:
            return metadata.version(self.library)
        except metadata.PackageNotFoundError:
            return None


def _streaming_response(cls: Any) -> Any:
    return cls(streaming_content=[])


def _drf_request(cls: Any) -> Any:
    from django.http import HttpRequest

    return cls(HttpRequest())


# Overrides: our code replaces the name, and falls back to the library's own behaviour without it.
POOL_EVENT_PROCESS_EXIT = PrivateName(
    "celery",
    "celery.concurrency.asynpool:AsynPool",
    "_event_process_exit",
    used_by="webapp/celery_pool.py (AsynPool looks again after a child's exit)",
    without="the worker runs Celery's own prefork pool (a replacement child may wait for its 5 s check)",
)
POOL_RUNNING_JOB_CHILD = PrivateName(
    "billiard",
    "billiard.pool:ApplyResult",
    "_write_to",
    used_by=(
        "webapp/celery_pool.py (AsynPool.flush keeps a child that still runs a task marked busy "
        "when a lost broker connection flushes the pool; with Celery's _busy_workers and _cache)"
    ),
    without=(
        "after a lost broker connection, new tasks may be written to children still running one "
        "and wait behind it while other children idle"
    ),
)
CELERY_GET_BACKEND = PrivateName(
    "celery",
    "celery.app.base:Celery",
    "_get_backend",
    used_by="webapp/celery.py (App looks up the result backend's class once per process)",
    without="Celery's own lookup runs (an entry-point scan per thread's backend)",
)
BILLIARD_MEM_RSS = PrivateName(
    "billiard",
    "billiard.pool",
    "mem_rss",
    used_by="webapp/speech/runtime/recycling.py (install_exit_hook: a child leaves after its task)",
    without=(
        "the exit hook is not installed and the children keep no recycle policy of their own: "
        "only Celery's worker_max_tasks_per_child and worker_max_memory_per_child replace them"
    ),
)
# Reads: our code looks at the name and copes without it.
DJANGO_RESOURCE_CLOSERS = PrivateName(
    "django",
    "django.http.response:StreamingHttpResponse",
    "_resource_closers",
    used_by="webapp/speech/services/waiting.py (a streamed answer gives its wait slot back when closed)",
    without="a streamed answer's wait slot goes back as the stream starts",
    instance=_streaming_response,
)
DRF_REQUEST = PrivateName(
    "djangorestframework",
    "rest_framework.request:Request",
    "_request",
    used_by="webapp/problems.py (the Django request a DRF one wraps)",
    without="a request that asks to wait is answered at once (its wait slot lapses at its expiry)",
    instance=_drf_request,
)
SOUNDFILE_FFI = PrivateName(
    "soundfile",
    "soundfile",
    "_ffi",
    used_by="webapp/speech/services/outputs.py (storage_error_code reads the C errno of a failed write)",
    without="a failed audio write is reported as storage_error, a full disk included",
)
# The package's layout: the model module imported with ``voxcpm/__init__`` (and its torchaudio
# import) skipped, and its module-level ``tqdm`` replaced to silence the per-patch bar.
VOXCPM_MODEL_MODULES = PrivateName(
    "voxcpm",
    "voxcpm.model.voxcpm2",
    "tqdm",
    used_by=(
        "synth/engines/voxcpm_package.py (imports voxcpm.model.voxcpm2 without the package's __init__, "
        "which imports torchaudio; replaces the module's tqdm with a disabled one)"
    ),
    without="the voxcpm engine is unavailable (its model module does not import), or logs a progress bar",
    importer="synth.engines.voxcpm_package:module_named",
    checked_on="2.0.3",
)

ALL: tuple[PrivateName, ...] = (
    POOL_EVENT_PROCESS_EXIT,
    POOL_RUNNING_JOB_CHILD,
    CELERY_GET_BACKEND,
    BILLIARD_MEM_RSS,
    DJANGO_RESOURCE_CLOSERS,
    DRF_REQUEST,
    SOUNDFILE_FFI,
    VOXCPM_MODEL_MODULES,
)

# Names reported missing in this process (a forked child inherits its parent's).
_reported: set[str] = set()


def check(private: PrivateName) -> bool:
    """Whether ``private`` exists; when it does not, one ERROR per process says which and what runs instead.

    A library this process does not have installed is not used here: False, and nothing to say.
    """
    if private.present():
        return True
    version = private.version()
    if version is not None and private.where not in _reported:
        _reported.add(private.where)
        log.error(
            "%s %s has no %s, which %s relies on: %s. Check that use against this version.",
            private.library,
            version,
            private.where,
            private.used_by,
            private.without,
        )
    return False


def check_all(**_: Any) -> list[PrivateName]:
    """Check every listed name (at a process's start); the missing ones.

    Names with an ``importer`` are left to the code that uses them (their import is a model's:
    torch and more, never in the web tier): the VoxCPM engine reports its own failure to import as
    engine_unavailable, and tests/unit/test_private_apis.py checks them against the installed version.
    """
    return [private for private in ALL if private.importer is None and not check(private)]


signals.worker_init.connect(check_all, weak=False)
signals.beat_init.connect(check_all, weak=False)
