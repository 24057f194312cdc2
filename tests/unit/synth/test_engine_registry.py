"""The engine registry (issue 50): engines from entry points, namespaced voice ids, capabilities.

The tiny engine is a real distribution built from tests/engine_plugins/tiny and put on
``sys.path``; importlib.metadata reads it as it reads any installed package.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from synth import Synthesizer, registry
from synth.errors import EngineUnavailable

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    tmp = tmp_path_factory.mktemp("tiny")
    shutil.copytree(ROOT / "tests" / "engine_plugins" / "tiny", tmp / "source")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(site), str(tmp / "source")],
        check=True,
        capture_output=True,
    )
    return site


@pytest.fixture
def on_path(tiny_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tiny_site))
    yield tiny_site
    sys.modules.pop("tiny_tts_engine", None)


def test_the_projects_own_metadata_registers_its_engines_as_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    group = project["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert (
        group
        == registry.BUILTIN_ENGINES
        == {
            "piper": "synth.engines.plugins:piper",
            "espeak": "synth.engines.plugins:espeak",
            "voxcpm": "synth.engines.voxcpm:plugin",
        }
    )


def test_an_installed_distribution_adds_its_engine_and_voices_and_removed_they_go(on_path: Path) -> None:
    assert "tiny" in registry.installed()
    beep = registry.get_voice("tiny:beep")
    assert beep.engine == "tiny" and beep.capabilities["instructions"] is False
    assert registry.engine_distribution("tiny") == ("tiny-tts-engine", "0.1.0")
    sys.path.remove(str(on_path))
    assert "tiny" not in registry.installed()
    with pytest.raises(ValueError, match="unknown engine 'tiny'"):
        registry.list_voices(engines=["tiny"])


def test_a_voice_is_named_by_its_historic_id_or_by_engine_and_name() -> None:
    assert registry.get_voice("espeak:cmn").id == "espeak-cmn"
    assert registry.get_voice("piper:en_US-joe-medium").id == "en_US-joe-medium"
    assert "espeak:yue" in registry.get_voice("espeak-yue").aliases


def test_every_voice_declares_every_capability_the_service_reads() -> None:
    for voice in registry.list_voices():
        assert set(registry.CAPABILITY_DEFAULTS) <= set(voice.capabilities), voice.id
    assert registry.get_voice("espeak-en-us").capabilities["devices"] == ["cpu"]
    assert "cuda" in registry.get_voice("en_US-joe-medium").capabilities["devices"]


def test_a_worker_synthesizer_serves_the_engines_that_load_and_names_the_one_that_cannot(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINY_TTS_FAIL_LOAD", "1")
    synth = Synthesizer(engines=["espeak", "tiny", "nosuch"], tolerant=True)
    synth.load()
    assert synth.served_engines() == ["espeak"]
    assert "weights missing" in synth.unavailable["tiny"] and "nosuch" in synth.unavailable
    assert not any(v.engine == "tiny" for v in synth.voices())


def test_a_model_needing_more_memory_than_a_child_may_hold_is_not_loaded(on_path: Path) -> None:
    synth = Synthesizer(engines=["espeak"], tolerant=False)
    synth.memory_limit_mb = 5  # eSpeak declares 20 MB a loaded model
    with pytest.raises(EngineUnavailable, match="needs 20 MB"):
        synth.load()


GPU_PLUGIN = """
from synth.engines.plugins import EspeakPlugin


class GpuPlugin(EspeakPlugin):  # eSpeak's voices, declared as a model that runs on CUDA too
    def capabilities(self, options):
        return {**super().capabilities(options), "devices": ["cpu", "cuda"]}


plugin = GpuPlugin()
"""


def test_a_gpu_worker_runs_each_engine_where_its_devices_say(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second distribution, written by hand as any installer lays one out (no build needed).
    (tmp_path / "gpuish_engine.py").write_text(GPU_PLUGIN)
    info = tmp_path / "gpuish_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpuish-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tts_service.engines]\ngpuish = gpuish_engine:plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    synth = Synthesizer(device="cuda:0", engines=["gpuish", "tiny", "espeak"])
    assert synth._engine_device("gpuish") == "cuda:0"
    assert synth._engine_device("tiny") == "cpu" and synth._engine_device("espeak") == "cpu"
