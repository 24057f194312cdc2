"""Fixtures of the manifests' tests: the validators' tools (.venv-k8s) and each overlay rendered once."""

from __future__ import annotations

import subprocess

import pytest

from deploy import validate_k8s as validate

VENV_BIN = validate.ROOT / ".venv-k8s" / "bin"


@pytest.fixture(scope="session")
def k8s_tools() -> validate.Tools:
    """kubectl, kubernetes-validate and checkov, installed into .venv-k8s when missing (about 30 s once)."""
    subprocess.run([str(validate.K8S / "validate.sh"), "--tools-only"], check=True, timeout=600)
    return validate.Tools.find(VENV_BIN)


@pytest.fixture(scope="session")
def rendered(k8s_tools: validate.Tools) -> dict[str, list[validate.Doc]]:
    return {overlay.name: validate.render(k8s_tools, overlay) for overlay in validate.overlays()}
