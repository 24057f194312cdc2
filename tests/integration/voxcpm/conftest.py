"""The tiny VoxCPM2 (tests/gpu/voxcpm_tiny.py), built and verified once per session, and the engine's entry point.

The shared editable install's metadata may predate the ``voxcpm`` entry point (pyproject.toml):
``voxcpm_site`` is a folder holding only a dist-info with that entry point, as ``pip install -e .``
writes it, put on ``sys.path`` here and on a worker's PYTHONPATH (after the checkout).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.provision import ROOT

if importlib.util.find_spec("voxcpm") is None:  # the engine's package is not in this venv
    pytest.skip("voxcpm is not installed (pip install --no-deps voxcpm==2.0.3)", allow_module_level=True)

ENTRY_POINTS = "[tts_service.engines]\nvoxcpm = synth.engines.voxcpm:plugin\n"


@pytest.fixture(scope="session")
def voxcpm_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("voxcpm-site")
    info = site / "tts_voxcpm_entry_point-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tts-voxcpm-entry-point\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


@pytest.fixture(scope="session")
def voxcpm_models(tmp_path_factory: pytest.TempPathFactory, voxcpm_site: Path) -> Iterator[Path]:
    """TTS_MODELS_DIR with ``voxcpm/``: the tiny model, verified by synth.models as `manage.py models verify` does."""
    import sys

    from synth import models
    from tests.gpu.voxcpm_tiny import build_tiny_voxcpm2

    root = tmp_path_factory.mktemp("voxcpm-models")
    build_tiny_voxcpm2(root / "voxcpm", seed=0)
    sys.path.append(str(voxcpm_site))
    try:
        report = models.verify(root, "voxcpm")
        assert report.ok, report.lines()
        yield root
    finally:
        sys.path.remove(str(voxcpm_site))


@pytest.fixture(scope="session")
def voxcpm_model(voxcpm_models: Path) -> Path:
    return voxcpm_models / "voxcpm"


@pytest.fixture(scope="session")
def voxcpm_engine(voxcpm_model: Path) -> object:
    from synth.engines.voxcpm import VoxCPMEngine

    engine = VoxCPMEngine(str(voxcpm_model), threads=1)
    engine.load("cpu")
    return engine


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def worker_path(site: Path) -> str:
    return os.pathsep.join([str(ROOT), str(site)])
