"""The one place that imports the ``voxcpm`` package's model modules (checked on voxcpm 2.0.3).

``import voxcpm`` runs ``voxcpm/__init__.py`` -> ``voxcpm.core``, which imports both model
versions (``voxcpm.model.voxcpm``, VoxCPM 1.5, imports ``torchaudio`` at its top) and
``huggingface_hub``; ``voxcpm.model``'s ``__init__`` imports both model versions too.
torchaudio does not import with this project's CPU torch (no matching build), and the
service needs neither ``voxcpm.core`` (hub downloads, a denoiser, prints) nor the other
model. So, where ``import voxcpm.model`` fails, :func:`model_module` puts the two
packages ``voxcpm`` and ``voxcpm.model`` into ``sys.modules`` as empty package objects with
the installed package's search path, *without running their ``__init__``*, and imports
the one model module wanted (``voxcpm.model.voxcpm2``: its own imports are torch,
librosa, einops, pydantic, tqdm, transformers, safetensors and the package's
``voxcpm.modules``, whose ``__init__`` files are empty). VoxCPM 1.5's module still needs
torchaudio: where it does not import, that architecture is unavailable (a CUDA host with
a matching torchaudio has it).

It also silences the per-patch progress bar: ``_inference`` wraps its loop in the
module's ``tqdm``; the module's name ``tqdm`` is replaced by one with ``disable=True``.

Both rely on the package's layout, not on an API: ``webapp/private_apis.py`` lists them
(``VOXCPM_MODEL_MODULES``) with the version they were checked on, and
``tests/unit/test_private_apis.py`` checks them against the installed version.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
import types
from typing import Any

log = logging.getLogger(__name__)

CHECKED_ON = "2.0.3"
# config.json's ``architecture`` -> the model module (``voxcpm.core`` reads the same field).
MODULES = {"voxcpm2": "voxcpm.model.voxcpm2", "voxcpm": "voxcpm.model.voxcpm"}
PACKAGES = ("voxcpm", "voxcpm.model")


class PackageMissing(ImportError):
    """voxcpm, or a module its model code imports, is not installed (or does not import)."""


def _bare_package(name: str) -> None:
    """``name`` in sys.modules as the installed package, its ``__init__`` not run."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise PackageMissing(f"{name} is not installed")
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    module.__file__ = spec.origin
    module.__package__ = name
    sys.modules[name] = module


def model_module(architecture: str) -> Any:
    """``voxcpm.model.<voxcpm2|voxcpm>`` for a config's ``architecture``, its progress bar off.

    Raises :class:`PackageMissing` when voxcpm or one of the model's imports is absent (for
    VoxCPM 1.5 where torchaudio does not import), ValueError for an architecture voxcpm lacks.
    """
    name = MODULES.get(architecture.lower())
    if name is None:
        raise ValueError(f"unknown VoxCPM architecture {architecture!r}; known: {', '.join(MODULES)}")
    if importlib.util.find_spec("voxcpm") is None:
        raise PackageMissing("voxcpm is not installed")
    for package in PACKAGES:
        _bare_package(package)
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise PackageMissing(f"{name} does not import: {type(exc).__name__}: {exc}") from exc
    tqdm = getattr(module, "tqdm", None)
    if tqdm is None:
        log.warning(
            "%s has no tqdm (checked on voxcpm %s): its progress bar may reach the log", name, CHECKED_ON
        )
    elif not isinstance(tqdm, functools.partial):
        setattr(module, "tqdm", functools.partial(tqdm, disable=True))  # noqa: B010
    return module


def module_named(name: str) -> Any:
    """The model module ``name`` (``voxcpm.model.voxcpm2``) as :func:`model_module` imports it."""
    by_module = {module: arch for arch, module in MODULES.items()}
    if name not in by_module:
        raise ValueError(f"not a voxcpm model module: {name}")
    return model_module(by_module[name])


__all__ = ["CHECKED_ON", "MODULES", "PackageMissing", "model_module", "module_named"]
