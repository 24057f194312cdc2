"""Points in a worker child's work where a plug-in module may act: none by default.

``TTS_WORKER_HOOKS`` names a module (dotted path) that the child imports when it
loads its model; each of its functions below, where present, is called at that
point. The test suite uses it to inject faults (tests/faults.py: a child that dies
before its commit, runs out of memory, hangs); production leaves it empty and
these calls cost one attribute lookup.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

_installed: list[ModuleType | None] = [None]


def install(dotted: str | None = None) -> ModuleType | None:
    """Import the hooks module ``dotted`` (default: ``TTS_WORKER_HOOKS``); none when empty."""
    name = settings.TTS_WORKER_HOOKS if dotted is None else dotted
    module = importlib.import_module(name) if name else None
    if module is not None:
        log.warning("worker hooks installed from %s", name)
    _installed[0] = module
    return module


def _call(point: str, *args: Any) -> None:
    module = _installed[0]
    hook = getattr(module, point, None) if module is not None else None
    if hook is not None:
        hook(*args)


def after_load(synthesizer: Any) -> None:
    """The child's engines are loaded, before the warm-up."""
    _call("after_load", synthesizer)


def before_synthesis(job: Any) -> None:
    """An attempt is about to synthesise its claimed job."""
    _call("before_synthesis", job)


def after_progress(job: Any, done: int, total: int) -> None:
    """An attempt wrote sentence ``done`` of ``total`` to its partial file and recorded it."""
    _call("after_progress", job, done, total)


def before_cache_write(job: Any) -> None:
    """A sentence of the job is about to be written to its tenant's sentence cache (the file is open)."""
    _call("before_cache_write", job)


def before_commit(job: Any) -> None:
    """An attempt's file is in place; its completion is about to be written."""
    _call("before_commit", job)
