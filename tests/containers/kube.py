"""The rendered `local` overlay, changed only where podman 4.3's `kube play` differs from a cluster.

``kubectl kustomize deploy/k8s/overlays/local`` is the input; :func:`for_podman` returns what
`podman kube play` runs. Each change says why; everything else goes through as rendered
(Deployments, the ConfigMap kustomize generated, the media PersistentVolumeClaim, emptyDirs,
security contexts, resources, commands and environment):

- kinds podman ignores or mishandles are dropped (Services, the migration Job, the autoscalers,
  PodDisruptionBudgets, NetworkPolicies, KEDA's and the Prometheus Operator's objects); the test
  runs the migrations as a one-off container instead;
- PostgreSQL and Redis of the ``dev`` component are dropped: the test runs them on this
  machine's loopback (their official images cannot be pulled here);
- every pod uses the host's network (no bridge, no addresses outside 127.0.0.0/8) and each
  listener binds 127.0.0.1 on a port of the test's: the web's ``--bind``, the edge's ports;
- a Secret's key read by ``secretKeyRef`` becomes the value the test gives (a key it does not
  give fails here, as a missing key would fail the pod); a Secret volume becomes a hostPath
  folder holding the same items; ``fieldRef: status.podIP`` becomes 127.0.0.1 and ``$(NAME)``
  references are expanded, neither of which podman 4.3 does;
- init containers are dropped, and their command (``prepare_var``) runs in front of the main
  command: podman 4.3 restarts a finished init container under the pod's ``restartPolicy: Always``
  and never starts the main one; ``wait_for_schema`` has nothing to wait for after the one-off
  migration;
- probes are dropped (podman 4.3 turns them into its own health checks, with restarts of its own);
  the update strategy is ignored by podman anyway.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

DROPPED_KINDS = {
    "Service",
    "Job",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "ScaledObject",
    "TriggerAuthentication",
    "ServiceMonitor",
    "Secret",
    "Namespace",
}
# The dev component's in-cluster data services: the test runs both on the host's loopback.
DATA_COMPONENTS = {"postgres", "redis"}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


class MissingSecretKey(KeyError):
    """A manifest reads a Secret key the test (standing in for the Secret) does not have."""


@dataclass
class PodmanPlan:
    """What the test gives in place of the cluster: values, folders and ports."""

    secrets: Mapping[str, Mapping[str, str]]  # Secret name -> key -> value
    secret_dirs: Mapping[str, str]  # Secret name -> host folder holding its keys as files
    web_port: int
    http_port: int
    https_port: int
    settings: Mapping[str, str] = field(default_factory=dict)  # added to the ConfigMap
    replicas: Mapping[str, int] = field(default_factory=dict)  # Deployment name -> replicas


def load(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def _component(doc: Mapping[str, Any]) -> str:
    return str(doc.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component", ""))


def _secret_value(plan: PodmanPlan, ref: Mapping[str, Any]) -> str | None:
    name, key = ref["name"], ref["key"]
    values = plan.secrets.get(name, {})
    if key in values:
        return values[key]
    if ref.get("optional"):
        return None
    raise MissingSecretKey(f"Secret {name} has no key {key!r} (the test's stand-in for it)")


# The pod's own address, read through the downward API: the host's loopback here.
FIELDS = {"status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _env(plan: PodmanPlan, env: list[dict[str, Any]], known: dict[str, str]) -> list[dict[str, Any]]:
    """Literal values: Secret keys and downward-API fields resolved, ``$(NAME)`` expanded.

    podman 4.3 supports neither ``fieldRef: status.podIP`` nor Kubernetes' ``$(NAME)`` references
    to variables defined before (the ConfigMap's through envFrom, then the list's own, in order).
    """
    out = []
    known = dict(known)
    for item in env:
        source = item.get("valueFrom", {})
        if "secretKeyRef" in source:
            value = _secret_value(plan, source["secretKeyRef"])
        elif "fieldRef" in source:
            value = FIELDS[source["fieldRef"]["fieldPath"]]
        elif "value" in item:
            value = _REFERENCE.sub(lambda m: known.get(m.group(1), m.group(0)), str(item["value"]))
        else:
            out.append(item)  # a ConfigMap key, which podman reads itself
            continue
        if value is not None:
            known[item["name"]] = value
            out.append({"name": item["name"], "value": value})
    return out


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = [item for item in container.get("env", []) if item["name"] != name]
    container["env"] = [*env, {"name": name, "value": value}]


def _loopback(plan: PodmanPlan, container: dict[str, Any]) -> None:
    """Listeners on 127.0.0.1 and the test's ports: the host's network is shared by every pod."""
    command = container.get("command", [])
    if "gunicorn" in command[:1]:
        if "0.0.0.0:8000" not in command:
            raise AssertionError(f"the web container no longer binds 0.0.0.0:8000: {command}")
        container["command"] = [
            f"127.0.0.1:{plan.web_port}" if arg == "0.0.0.0:8000" else arg for arg in command
        ]
    names = {item["name"] for item in container.get("env", [])}
    if "TTS_EDGE_UPSTREAM" in names:
        _set_env(container, "TTS_EDGE_UPSTREAM", f"127.0.0.1:{plan.web_port}")
        _set_env(container, "TTS_HTTP_PORT", str(plan.http_port))
        _set_env(container, "TTS_HTTPS_PORT", str(plan.https_port))
        _set_env(container, "TTS_NGINX_LISTEN", "127.0.0.1")
    container.pop("ports", None)


def _pod(plan: PodmanPlan, spec: dict[str, Any], config_maps: Mapping[str, Mapping[str, str]]) -> None:
    spec["hostNetwork"] = True
    prepare = [c["command"] for c in spec.pop("initContainers", []) if "prepare_var" in c.get("command", [])]
    for container in spec["containers"]:
        for probe in PROBES:
            container.pop(probe, None)
        known: dict[str, str] = {}
        for source in container.get("envFrom", []):
            known.update(config_maps.get(source.get("configMapRef", {}).get("name", ""), {}))
        container["env"] = _env(plan, container.get("env", []), known)
        _loopback(plan, container)
        if prepare and container.get("command"):
            # The init step, then the main command, in one shell: `exec` keeps the main process pid 1.
            script = f'{shlex.join(prepare[0])} >/dev/null && exec "$@"'
            container["command"] = ["sh", "-c", script, "--", *container["command"]]
    for volume in spec.get("volumes", []):
        secret = volume.pop("secret", None)
        if secret is not None:
            volume["hostPath"] = {"path": plan.secret_dirs[secret["secretName"]], "type": "Directory"}


def for_podman(docs: list[dict[str, Any]], plan: PodmanPlan) -> list[dict[str, Any]]:
    config_maps = {
        d["metadata"]["name"]: {
            **d.get("data", {}),
            **(plan.settings if d["metadata"]["name"].startswith("tts-settings") else {}),
        }
        for d in docs
        if d.get("kind") == "ConfigMap"
    }
    out = []
    for original in docs:
        doc = copy.deepcopy(original)
        kind = doc.get("kind")
        if kind in DROPPED_KINDS or _component(doc) in DATA_COMPONENTS:
            continue
        name = doc["metadata"]["name"]
        if kind == "PersistentVolumeClaim" and name != "tts-media":
            continue  # the dev component's PostgreSQL volume
        if kind == "ConfigMap" and name.startswith("tts-settings"):
            doc["data"] = {**doc.get("data", {}), **plan.settings}
        if kind == "Deployment":
            doc["spec"].pop("strategy", None)
            doc["spec"]["replicas"] = plan.replicas.get(name, 1)
            _pod(plan, doc["spec"]["template"]["spec"], config_maps)
        out.append(doc)
    return out


def secret_keys_read(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Every (Secret, key) a pod reads through ``secretKeyRef`` or a Secret volume's items."""
    keys: set[tuple[str, str]] = set()
    for doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    keys.add((ref["name"], ref["key"]))
        for volume in spec.get("volumes", []):
            secret = volume.get("secret")
            for item in (secret or {}).get("items", []):
                keys.add((secret["secretName"], item["key"]))
    return keys
