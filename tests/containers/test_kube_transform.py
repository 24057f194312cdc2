"""The podman changes to the rendered `local` overlay (tests/containers/kube.py), without podman.

Runs in `make test`: the overlay renders, every Secret key a pod reads is given by the test's
stand-in, a key it lacks fails before anything runs, and what podman gets keeps to loopback.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.containers import kube

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "local"
SECRETS = {
    "tts-secrets": {
        "DATABASE_URL": "postgres://tts:x@127.0.0.1:1/tts",
        "REDIS_URL": "redis://:x@127.0.0.1:2/0",
        "DJANGO_SECRET_KEY": "k",
        "TTS_API_KEY_SECRET": "a",
    }
}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None or not OVERLAY.is_dir():
        pytest.skip("kubectl or deploy/k8s/overlays/local is missing")
    out = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True)
    return kube.load(out.stdout)


def _plan(secrets: dict[str, dict[str, str]]) -> kube.PodmanPlan:
    return kube.PodmanPlan(
        secrets=secrets,
        secret_dirs={"tts-secrets": "/nonexistent/s", "tts-tls": "/nonexistent/t"},
        web_port=21001,
        http_port=21002,
        https_port=21003,
        settings={"TTS_JOB_LEASE_SECONDS": "10"},
        replicas={"tts-worker-cpu": 2},
    )


def test_podman_gets_deployments_on_loopback_with_every_secret_resolved(
    rendered: list[dict[str, Any]],
) -> None:
    played = kube.for_podman(rendered, _plan(SECRETS))
    kinds = {d["kind"] for d in played}
    assert kinds <= {"Deployment", "ConfigMap", "PersistentVolumeClaim"}, kinds
    deployments = {d["metadata"]["name"]: d for d in played if d["kind"] == "Deployment"}
    assert {"tts-web", "tts-edge", "tts-worker-cpu", "tts-beat", "tts-housekeeping"} <= set(deployments)
    assert not {"tts-postgres", "tts-redis"} & set(deployments)  # on the host's loopback instead
    assert deployments["tts-worker-cpu"]["spec"]["replicas"] == 2
    text = kube.dump(played)
    assert "secretKeyRef" not in text
    assert not re.search(r"(?<![0-9.])0\.0\.0\.0(?![0-9/])", text)  # every listener on loopback
    for deployment in deployments.values():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["hostNetwork"] is True and "initContainers" not in spec
        for container in spec["containers"]:
            assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(container)
    web = deployments["tts-web"]["spec"]["template"]["spec"]["containers"][0]
    assert "127.0.0.1:21001" in web["command"] and "prepare_var" in web["command"][2]
    for name, value in ((e["name"], e.get("value", "")) for e in web["env"]):
        assert "$(" not in value and "valueFrom" not in web["env"], (name, value)
    edge_env = {
        e["name"]: e.get("value")
        for e in deployments["tts-edge"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert edge_env["TTS_EDGE_UPSTREAM"] == "127.0.0.1:21001" and edge_env["TTS_NGINX_LISTEN"] == "127.0.0.1"
    assert edge_env["TTS_HTTPS_PORT"] == "21003"
    (settings,) = [d for d in played if d["kind"] == "ConfigMap"]
    assert settings["data"]["TTS_JOB_LEASE_SECONDS"] == "10"


# The keys read as variables (secretKeyRef); the two read as files come from a Secret volume,
# whose keys tests/k8s checks against deploy/k8s/secret.example.yaml.
@pytest.mark.parametrize("key", ["DATABASE_URL", "REDIS_URL"])
def test_a_secret_key_the_pods_read_but_nobody_gives_fails_before_anything_runs(
    rendered: list[dict[str, Any]], key: str
) -> None:
    assert ("tts-secrets", key) in kube.secret_keys_read(rendered)
    incomplete = {"tts-secrets": {k: v for k, v in SECRETS["tts-secrets"].items() if k != key}}
    with pytest.raises(kube.MissingSecretKey, match=key):
        kube.for_podman(rendered, _plan(incomplete))
