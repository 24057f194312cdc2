"""The Kubernetes manifests' validators: `make validate-k8s` (deploy/k8s/validate.sh runs this module).

For every overlay of deploy/k8s/overlays:

1. `kubectl kustomize` renders it;
2. `kubernetes-validate --strict` checks the built-in kinds against the schema of one pinned
   Kubernetes release (it only warns on custom resources and exits 0, which checks nothing), so
3. the custom resources (KEDA's ScaledObject and TriggerAuthentication, the Prometheus
   Operator's ServiceMonitor) are validated with jsonschema against deploy/k8s/schemas/;
4. the project's own rules (:func:`project_problems`): image tags, Secret keys, settings names,
   worker shutdown, probes, memory, queues and backlog queries, who reaches the data services,
   every app Deployment waiting for its schema, every workload as the table of process roles
   (deploy/roles.py) says.

Then checkov scans deploy/k8s (plain manifests and kustomize) and deploy/container/Dockerfile when
it exists, skipping only the checks deploy/k8s/checkov-skips.yaml justifies; its summary names
each framework and file scanned.

Runs on the validators' venv (.venv-k8s: PyYAML and jsonschema, the binaries beside them) or on
the project's (both are in the lock); standard library otherwise, no Django.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from deploy import role_forms
from deploy.roles import WORKER_STOP_MARGIN_SECONDS

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = K8S / "overlays"
SCHEMAS = K8S / "schemas"
SECRET_TEMPLATE = K8S / "secret.example.yaml"
SETTINGS_ENV = K8S / "base" / "settings.env"
CHECKOV_SKIPS = K8S / "checkov-skips.yaml"
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
GUNICORN_CONF = ROOT / "deploy" / "gunicorn.conf.py"
NGINX_TEMPLATE = ROOT / "nginx" / "nginx.conf.template"
README = ROOT / "README.md"

# The oldest Kubernetes release the manifests are written for: autoscaling/v2, policy/v1, batch/v1
# with ttlSecondsAfterFinished, emptyDir sizeLimit. kubernetes-validate ships schemas up to 1.37.
KUBERNETES_VERSION = "1.33.0"

# Custom resources and the schema each is validated against (kubernetes-validate skips them).
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
}

# A release tag (1.2.3, 0.1.0-local, 16.4-bookworm) or a digest; never `latest`, never none.
TAG_RE = re.compile(r"^v?[0-9]+(\.[0-9]+){1,2}([-+.][0-9A-Za-z][0-9A-Za-z.-]*)?$")
DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")

# Our images (the Django ones read the settings; the edge renders its Nginx config).
OUR_IMAGES = ("tts-web", "tts-worker", "tts-worker-gpu", "tts-analysis", "tts-edge")
DJANGO_IMAGES = ("tts-web", "tts-worker", "tts-worker-gpu", "tts-analysis")

# Environment a Django container may set that is not an app setting in the README's table.
# POD_IP: the web pods' own address, added to DJANGO_ALLOWED_HOSTS for Prometheus' scrapes (base/web.yaml).
NON_SETTINGS = {"DJANGO_SETTINGS_MODULE", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "HOME", "POD_IP"}

# The pods that reach PostgreSQL and Redis (NetworkPolicy tts-data-clients), by component label.
DATA_CLIENTS = {"web", "beat", "housekeeping", "analysis", "webhooks", "migrate"}
DATA_CLIENT_LABEL = "tts-data-client"
# Memory of a Celery parent beside its children (Mi), in the workers' requests and limits.
WORKER_PARENT_MI = 256
PROBE_MODULE = "webapp.speech.runtime.probe"
# The initContainer of every Deployment that runs the app's code: it waits for the schema its code needs.
WAIT_FOR_SCHEMA = ["python", "manage.py", "wait_for_schema"]
ACTIVE_STATUSES = ("queued", "running")  # webapp/speech/models.py ACTIVE_STATUSES
JOB_TABLE = "speech_synthesisjob"

# Kinds the manifests may hold that have no namespace.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}

Doc = dict[str, Any]


@dataclass
class Tools:
    kubectl: str
    kubernetes_validate: str
    checkov: str

    @classmethod
    def find(cls, bin_dir: Path | None) -> Tools:
        def which(name: str) -> str:
            if bin_dir is not None and (bin_dir / name).exists():
                return str(bin_dir / name)
            found = shutil.which(name)
            if found is None:
                raise SystemExit(f"validate-k8s: {name} not found: run deploy/k8s/validate.sh --tools-only")
            return found

        return cls(which("kubectl"), which("kubernetes-validate"), which("checkov"))


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)


# ----------------------------------------------------------------------------- rendering


def overlays() -> list[Path]:
    return sorted(p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").exists())


def render(tools: Tools, overlay: Path) -> list[Doc]:
    out = subprocess.run(
        [tools.kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RenderError(out.stderr.strip() or f"kubectl kustomize exited {out.returncode}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class RenderError(RuntimeError):
    pass


def load_yaml_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def name_of(doc: Doc) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


# ----------------------------------------------------------------------------- schema checks


def kubernetes_validate(tools: Tools, docs: list[Doc], where: str, report: Report) -> None:
    """Built-in kinds against Kubernetes' own schema, strict: an unknown field is an error."""
    builtin = [d for d in docs if (d.get("apiVersion"), d.get("kind")) not in CRD_SCHEMAS]
    with tempfile.TemporaryDirectory(prefix="tts-k8s-") as tmp:
        files = []
        for i, doc in enumerate(builtin):
            path = Path(tmp) / f"{i:03d}-{doc.get('kind')}-{doc.get('metadata', {}).get('name')}.yaml"
            path.write_text(yaml.safe_dump(doc))
            files.append(str(path))
        out = subprocess.run(
            [tools.kubernetes_validate, "--strict", "--quiet", "-k", KUBERNETES_VERSION, *files],
            capture_output=True,
            text=True,
            check=False,
        )
    if out.returncode != 0:
        for line in (out.stdout + out.stderr).strip().splitlines():
            report.fail(where, f"kubernetes-validate: {line.replace(tmp + '/', '')}")
    report.say(f"  kubernetes-validate {KUBERNETES_VERSION} --strict: {len(builtin)} built-in objects")


def crd_validate(docs: list[Doc], where: str, report: Report) -> None:
    seen = 0
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key not in CRD_SCHEMAS:
            group = str(doc.get("apiVersion", "")).rpartition("/")[0]
            if "." in group and not group.endswith(".k8s.io"):  # built-in groups: core, apps, *.k8s.io
                report.fail(where, f"{name_of(doc)}: a custom resource with no schema in deploy/k8s/schemas")
            continue
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
        validator = jsonschema.Draft202012Validator(schema)
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = "/".join(str(p) for p in error.absolute_path)
            report.fail(where, f"{name_of(doc)} ({CRD_SCHEMAS[key]}): at /{path}: {error.message}")
        seen += 1
    report.say(f"  jsonschema (deploy/k8s/schemas): {seen} custom resources")


# ----------------------------------------------------------------------------- project rules


def pod_specs(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(workload, pod spec) for every object that runs pods."""
    for doc in docs:
        template = doc.get("spec", {}).get("template")
        if doc.get("kind") in {"Deployment", "StatefulSet", "DaemonSet", "Job"} and template:
            yield doc, template.get("spec", {})


def containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def image_repo(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def check_image(image: str) -> str | None:
    """Why ``image`` is refused, or None: a release tag or a digest, never `latest` or no tag."""
    if DIGEST_RE.search(image):
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "no tag (an image with no tag is `latest`): set it in the overlay's images:"
    tag = last.split(":", 1)[1]
    if tag == "latest":
        return "tag `latest` moves under a running Deployment: use a release tag or a digest"
    if not TAG_RE.match(tag):
        return f"tag {tag!r} is not a release tag (X.Y.Z[-suffix]) or a digest"
    return None


def secret_template_keys(path: Path = SECRET_TEMPLATE) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    for doc in load_yaml_docs(path):
        if doc.get("kind") == "Secret":
            data = {**doc.get("stringData", {}), **doc.get("data", {})}
            keys[doc["metadata"]["name"]] = set(data)
    return keys


def secret_refs(docs: list[Doc]) -> Iterator[tuple[str, str, str, bool]]:
    """(where, secret name, key, optional) for every key of a Secret the manifests read."""
    for workload, pod in pod_specs(docs):
        for c in containers(pod):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    where = f"{name_of(workload)} {c['name']} env {env['name']}"
                    yield where, ref["name"], ref["key"], bool(ref.get("optional"))
            for src in c.get("envFrom", []):
                if "secretRef" in src:
                    yield f"{name_of(workload)} {c['name']} envFrom", src["secretRef"]["name"], "*", False
        for vol in pod.get("volumes", []):
            secret = vol.get("secret")
            if secret:
                items = secret.get("items") or [{"key": "*"}]
                for item in items:
                    where = f"{name_of(workload)} volume {vol['name']}"
                    yield where, secret["secretName"], item["key"], bool(secret.get("optional"))
    for doc in docs:
        if doc.get("kind") == "TriggerAuthentication":
            for ref in doc.get("spec", {}).get("secretTargetRef", []):
                yield f"{name_of(doc)} {ref['parameter']}", ref["name"], ref["key"], False


def readme_settings(path: Path = README) -> list[re.Pattern[str]]:
    """The settings table's names; `<JOB>` in a name stands for any suffix."""
    names = []
    for line in path.read_text().splitlines():
        m = re.match(r"^\| `([A-Z][A-Z0-9_<>]*)` \|", line)
        if m:
            names.append(re.compile("^" + re.sub(r"<[A-Z]+>", "[A-Z0-9_]+", m.group(1)) + "$"))
    return names


def parse_env_file(path: Path = SETTINGS_ENV) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def settings_of(docs: list[Doc], name: str) -> dict[str, str]:
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].startswith(name):
            return {k: str(v) for k, v in doc.get("data", {}).items()}
    return {}


def env_of(c: Doc, settings: dict[str, str]) -> dict[str, str]:
    """A container's plain environment: the ConfigMap's, then its own values (which win)."""
    env = dict(settings) if c.get("envFrom") else {}
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = "<from " + ",".join(item.get("valueFrom", {})) + ">"
    return env


def mebibytes(quantity: str | int) -> float:
    units = {
        "Ki": 1 / 1024,
        "Mi": 1,
        "Gi": 1024,
        "Ti": 1024**2,
        "K": 1e3 / 2**20,
        "M": 1e6 / 2**20,
        "G": 1e9 / 2**20,
    }
    text = str(quantity)
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text) / 2**20


def arg_after(command: list[str], flag: str) -> str | None:
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def query_engines(query: str) -> set[str] | None:
    """The engines a backlog query counts, as webapp/speech/services/keda.py writes it:
    ``... WHERE engine = 'piper' AND status IN ('queued', 'running')`` (or ``engine IN (...)``)."""
    flat = " ".join(query.split())
    statuses = re.search(r"\bstatus IN \(([^)]*)\)", flat)
    engines = re.search(r"\bengine IN \(([^)]*)\)", flat) or re.search(r"\bengine = ('[^']*')", flat)
    if not (statuses and engines and f"FROM {JOB_TABLE} WHERE" in flat):
        return None
    if {s.strip(" '") for s in statuses.group(1).split(",")} != set(ACTIVE_STATUSES):
        return None
    return {e.strip(" '") for e in engines.group(1).split(",")}


def project_problems(
    docs: list[Doc], where: str, secret_keys: dict[str, set[str]] | None = None
) -> list[str]:
    """The project's own rules on one rendered overlay; each problem one line."""
    report = Report()
    secret_keys = secret_template_keys() if secret_keys is None else secret_keys
    known = readme_settings()
    settings = settings_of(docs, "tts-settings")
    by_kind_name = {(d.get("kind"), d.get("metadata", {}).get("name")): d for d in docs}

    def known_setting(name: str) -> bool:
        return name in NON_SETTINGS or any(p.match(name) for p in known)

    # The ConfigMap names only settings the app reads (a typo there is silently ignored).
    for name in settings:
        if not known_setting(name):
            report.fail(where, f"ConfigMap tts-settings: {name} is not a setting in the README's table")

    # Every workload as the table of process roles says (deploy/roles.py): command, queues, role, probes.
    for problem in role_forms.k8s_problems(docs, complete=True):
        report.fail(where, problem)

    for secret_where, secret, key, optional in secret_refs(docs):
        if secret not in secret_keys:
            report.fail(where, f"{secret_where}: Secret {secret!r} is not in deploy/k8s/secret.example.yaml")
        elif key != "*" and key not in secret_keys[secret]:
            what = "an optional" if optional else "a"
            report.fail(
                where, f"{secret_where}: {what} key {key!r} that Secret {secret} (secret.example.yaml) lacks"
            )

    # KEDA's operator reads the Secrets its TriggerAuthentications name: never one holding the app's.
    keda_reads: dict[str, set[str]] = {}
    for doc in docs:
        if doc.get("kind") == "TriggerAuthentication":
            for ref in doc.get("spec", {}).get("secretTargetRef", []):
                keda_reads.setdefault(ref["name"], set()).add(ref["key"])
    pods_read = {
        secret
        for secret_where, secret, _k, _o in secret_refs(docs)
        if "TriggerAuthentication" not in secret_where
    }
    for secret, read in sorted(keda_reads.items()):
        others = sorted(secret_keys.get(secret, set()) - read)
        if others or secret in pods_read:
            report.fail(
                where,
                f"KEDA reads Secret {secret}, which also holds {', '.join(others) or 'what the pods read'}: "
                "give KEDA a Secret of its own",
            )

    for doc in docs:
        namespace = doc.get("metadata", {}).get("namespace")
        if doc.get("kind") not in CLUSTER_SCOPED and namespace in (None, "", "default"):
            report.fail(where, f"{name_of(doc)}: no namespace (the overlay sets one; never `default`)")

    scaled = {
        d["spec"]["scaleTargetRef"]["name"]: d
        for d in docs
        if d.get("kind") == "ScaledObject" and d.get("spec")
    }
    data_clients: set[str] = set()
    for workload, pod in pod_specs(docs):
        wname = name_of(workload)
        labels = pod_labels(workload)
        component = labels.get("app.kubernetes.io/component", "")
        if labels.get(DATA_CLIENT_LABEL) == "true":
            data_clients.add(component)
        security = pod.get("securityContext", {})
        if security.get("runAsNonRoot") is not True:
            report.fail(where, f"{wname}: the pod does not set runAsNonRoot: true")
        for c in containers(pod):
            image = str(c.get("image", ""))
            why = check_image(image)
            if why:
                report.fail(where, f"{wname} {c['name']}: image {image!r}: {why}")
            sc = c.get("securityContext", {})
            if (
                sc.get("readOnlyRootFilesystem") is not True
                or sc.get("allowPrivilegeEscalation") is not False
            ):
                report.fail(
                    where, f"{wname} {c['name']}: needs readOnlyRootFilesystem and no privilege escalation"
                )
            if image_repo(image) == "tts-edge":
                drain_problems(
                    report,
                    where,
                    workload,
                    pod,
                    c,
                    nginx_shutdown_timeout(),
                    "Nginx's worker_shutdown_timeout",
                )
            if image_repo(image) in DJANGO_IMAGES:
                for var in env_of(c, {}):
                    if not known_setting(var):
                        report.fail(
                            where, f"{wname} {c['name']}: env {var} is not a setting in the README's table"
                        )
        runs_app = any(
            image_repo(str(c.get("image", ""))) in DJANGO_IMAGES for c in pod.get("containers", [])
        )
        waits = any(c.get("command") == WAIT_FOR_SCHEMA for c in pod.get("initContainers", []))
        if workload.get("kind") == "Deployment" and runs_app and not waits:
            # Started before the migration Job ran, its code would meet an older schema.
            report.fail(where, f"{wname}: no initContainer runs `{' '.join(WAIT_FOR_SCHEMA)}`")
        if workload.get("kind") == "Job" and waits:
            report.fail(where, f"{wname}: a Job waiting for the schema would wait for itself if it migrates")
        for c in pod.get("containers", []):
            command = [str(a) for a in c.get("command", [])]
            if command[:4] == ["celery", "-A", "webapp", "worker"]:
                worker_problems(report, where, workload, pod, c, settings, scaled)
            if command[:1] == ["gunicorn"]:
                drain_problems(
                    report,
                    where,
                    workload,
                    pod,
                    c,
                    gunicorn_graceful_timeout(),
                    "gunicorn's graceful_timeout",
                )
                for kind, path in (("readinessProbe", "/healthz/ready"), ("livenessProbe", "/healthz/live")):
                    if c.get(kind, {}).get("httpGet", {}).get("path") != path:
                        report.fail(where, f"{wname}: the web tier's {kind} is GET {path} (webapp/health.py)")
        if component == "beat":
            if (
                workload.get("spec", {}).get("replicas") != 1
                or workload["spec"].get("strategy", {}).get("type") != "Recreate"
            ):
                report.fail(where, f"{wname}: beat runs as 1 replica with the Recreate strategy")
    # The edge must see each client's own address: the per-address limits, the failed-key count and the
    # log-in slow-down key on it (X-Real-IP). A balancer that rewrites the source (externalTrafficPolicy
    # Cluster) makes every client one address, unless Nginx trusts that balancer's forwarded header.
    for doc in docs:
        spec = doc.get("spec", {})
        if (
            doc.get("kind") == "Service"
            and spec.get("selector", {}).get("app.kubernetes.io/component") == "edge"
            and spec.get("type") in ("LoadBalancer", "NodePort")
            and spec.get("externalTrafficPolicy") != "Local"
            and not settings.get("TTS_NGINX_REAL_IP_FROM")
        ):
            report.fail(
                where,
                f"{name_of(doc)}: exposed with externalTrafficPolicy {spec.get('externalTrafficPolicy', 'Cluster')}"
                " hides the client's address; set it to Local, or name the balancer in TTS_NGINX_REAL_IP_FROM",
            )
    # SIGTERM makes Nginx drop every connection; SIGQUIT lets answers and sessions finish.
    if edge_stop_signal() != "SIGQUIT":
        report.fail(where, "the Dockerfile's edge stage must set STOPSIGNAL SIGQUIT (Nginx's graceful quit)")
    egress_problems(report, where, docs)
    metrics_problems(report, where, docs, settings)
    expected = DATA_CLIENTS | {c for c in data_clients if c.startswith("worker-")}
    workers = {
        name_of(w)
        for w, p in pod_specs(docs)
        if pod_labels(w).get("app.kubernetes.io/component", "").startswith("worker-")
    }
    if data_clients != expected or not workers:
        extra, missing = sorted(data_clients - expected), sorted(expected - data_clients)
        report.fail(
            where,
            f"pods labelled {DATA_CLIENT_LABEL} (reach PostgreSQL and Redis): extra {extra}, missing {missing}",
        )
    policy = by_kind_name.get(("NetworkPolicy", "tts-data-clients"))
    if not policy or policy["spec"].get("podSelector", {}).get("matchLabels") != {DATA_CLIENT_LABEL: "true"}:
        report.fail(
            where, "NetworkPolicy tts-data-clients must select exactly the pods labelled tts-data-client"
        )
    return report.problems


# Ports whose egress goes to one service the operator names: never to a whole network.
NAMED_DESTINATION_PORTS = {5432: "PostgreSQL", 6379: "Redis", 25: "SMTP", 465: "SMTP", 587: "SMTP"}
PLACEHOLDER_BLOCK = ipaddress.ip_network("192.0.2.0/24")
WIDEST_METRICS = {4: 16, 6: 48}


def egress_problems(report: Report, where: str, docs: list[Doc]) -> None:
    """Egress to PostgreSQL, Redis and the mail relay goes to their addresses (a /32 or /128 each, or
    in-cluster pods), never anywhere; a placeholder stays only where an in-cluster service replaces it."""
    in_cluster = {pod_labels(w).get("app.kubernetes.io/component") for w, _ in pod_specs(docs)}
    for doc in docs:
        if doc.get("kind") != "NetworkPolicy":
            continue
        for rule in doc.get("spec", {}).get("egress", []):
            ports = {p.get("port") for p in rule.get("ports", [])}
            named = sorted({NAMED_DESTINATION_PORTS[p] for p in ports if p in NAMED_DESTINATION_PORTS})
            if not named:
                continue
            blocks = [t["ipBlock"] for t in rule.get("to", []) if "ipBlock" in t]
            if not rule.get("to"):
                report.fail(where, f"{name_of(doc)}: egress to {'/'.join(named)} may go to any address")
            for block in blocks:
                net = ipaddress.ip_network(block["cidr"], strict=False)
                if net.prefixlen < net.max_prefixlen:
                    report.fail(
                        where,
                        f"{name_of(doc)}: egress to {'/'.join(named)} allows {net}: name the service's address",
                    )
                elif net.subnet_of(PLACEHOLDER_BLOCK) and not ({"postgres", "redis"} <= in_cluster):  # type: ignore[arg-type]
                    report.fail(
                        where,
                        f"{name_of(doc)}: egress to {'/'.join(named)} still names the placeholder {net}: "
                        "replace it with the service's address",
                    )


def metrics_problems(report: Report, where: str, docs: list[Doc], settings: dict[str, str]) -> None:
    """/metrics: the web pods answer a block no wider than a /16 (/48), the edge only its own pod."""
    for item in settings.get("TTS_METRICS_ALLOWED_IPS", "").split(","):
        if item.strip():
            net = ipaddress.ip_network(item.strip(), strict=False)
            if net.prefixlen < WIDEST_METRICS[net.version]:
                report.fail(
                    where, f"TTS_METRICS_ALLOWED_IPS: {net} is wider than a /{WIDEST_METRICS[net.version]}"
                )
    for workload, pod in pod_specs(docs):
        if pod_labels(workload).get("app.kubernetes.io/component") != "edge":
            continue
        for c in containers(pod):
            allowed = env_of(c, settings).get("TTS_METRICS_ALLOWED_IPS", "")
            if {a.strip() for a in allowed.split(",")} - {"127.0.0.1", "::1", ""}:
                report.fail(
                    where, f"{name_of(workload)}: the edge answers /metrics beyond its own pod ({allowed})"
                )


# Seconds the web and edge pods wait in preStop before their process hears SIGTERM (SIGQUIT for
# Nginx): the endpoints controller and every kube-proxy take that long to stop sending new
# connections to a pod that is going.
MIN_ENDPOINT_DRAIN_SECONDS = 3
DRAIN_MARGIN_SECONDS = 5


def gunicorn_graceful_timeout(path: Path = GUNICORN_CONF) -> int:
    """gunicorn's graceful_timeout: requests and sessions in flight get this long after SIGTERM."""
    found = re.search(r"^graceful_timeout = (\d+)$", path.read_text(), re.MULTILINE)
    if not found:
        raise ValueError(f"{path}: no `graceful_timeout = N` line")
    return int(found.group(1))


def nginx_shutdown_timeout(path: Path = NGINX_TEMPLATE) -> int:
    """Nginx's worker_shutdown_timeout: how long a graceful quit waits for open connections."""
    found = re.search(r"^worker_shutdown_timeout (\d+)s;$", path.read_text(), re.MULTILINE)
    if not found:
        raise ValueError(f"{path}: no `worker_shutdown_timeout Ns;` line")
    return int(found.group(1))


def edge_stop_signal(path: Path = DOCKERFILE) -> str | None:
    """The STOPSIGNAL of the Dockerfile's edge stage (None when it sets none)."""
    stage = re.search(r"^FROM \S+ AS edge$(.*?)(?=^FROM |\Z)", path.read_text(), re.MULTILINE | re.DOTALL)
    found = re.search(r"^STOPSIGNAL (\S+)$", stage.group(1), re.MULTILINE) if stage else None
    return found.group(1) if found else None


def drain_problems(
    report: Report, where: str, workload: Doc, pod: Doc, c: Doc, drain: int, what: str
) -> None:
    """A web or edge container: a preStop pause while endpoints forget the pod, then a drain that
    fits in the pod's grace period (else the kubelet kills sessions and waits mid-answer)."""
    wname = name_of(workload)
    command = [str(a) for a in c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])]
    pause = int(command[1]) if len(command) == 2 and command[0] == "sleep" and command[1].isdigit() else None
    if pause is None or pause < MIN_ENDPOINT_DRAIN_SECONDS:
        report.fail(
            where,
            f"{wname} {c['name']}: needs a preStop exec [sleep, N] with N >= {MIN_ENDPOINT_DRAIN_SECONDS} "
            "(new connections keep arriving until the endpoints forget the pod)",
        )
        return
    period = int(pod.get("terminationGracePeriodSeconds", 30))
    if period < pause + drain + DRAIN_MARGIN_SECONDS:
        report.fail(
            where,
            f"{wname}: terminationGracePeriodSeconds {period} must be at least the preStop sleep {pause} + "
            f"{what} {drain} + {DRAIN_MARGIN_SECONDS} s, or the kubelet kills what is still draining",
        )


def pod_labels(workload: Doc) -> dict[str, str]:
    return dict(workload.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}))


def worker_problems(
    report: Report,
    where: str,
    workload: Doc,
    pod: Doc,
    c: Doc,
    settings: dict[str, str],
    scaled: dict[str, Doc],
) -> None:
    """A Celery worker: warm stop, probes on the process, queues and memory as its settings say."""
    wname = name_of(workload)
    env = env_of(c, settings)
    command = [str(a) for a in c["command"]]
    grace = int(env.get("TTS_WORKER_STOP_GRACE", "60"))
    period = int(pod.get("terminationGracePeriodSeconds", 30))
    if period <= grace + WORKER_STOP_MARGIN_SECONDS:
        report.fail(
            where,
            f"{wname}: terminationGracePeriodSeconds {period} must exceed TTS_WORKER_STOP_GRACE {grace} "
            f"+ {WORKER_STOP_MARGIN_SECONDS} s, or a rolling update kills running jobs instead of handing them back",
        )
    if env.get("TTS_WORKER_ROLE", "synth") != "synth":
        return
    # The probe module reads the files synthesis children write (webapp/speech/runtime/probe.py).
    for kind, arg in (("startupProbe", "live"), ("livenessProbe", "live"), ("readinessProbe", "ready")):
        probe = c.get(kind, {}).get("exec", {}).get("command", [])
        if probe != ["python", "-m", PROBE_MODULE, arg]:
            report.fail(where, f"{wname}: {kind} must be `python -m {PROBE_MODULE} {arg}` (never Redis)")
    engines = [e.strip() for e in env.get("TTS_WORKER_ENGINES", "piper,espeak").split(",") if e.strip()]
    queues = (arg_after(command, "-Q") or "").split(",")
    if sorted(queues) != sorted(f"synth.{e}" for e in engines):
        report.fail(
            where, f"{wname}: -Q {','.join(queues)} does not match TTS_WORKER_ENGINES {','.join(engines)}"
        )
    concurrency = int(env.get("TTS_WORKER_CONCURRENCY", "2"))
    rss = int(env.get("TTS_WORKER_MAX_RSS_MB", "1500"))
    ceiling = int(env.get("TTS_WORKER_MAX_MEMORY_KB", "2000000")) / 1024
    resources = c.get("resources", {})
    request = mebibytes(resources.get("requests", {}).get("memory", "0"))
    limit = mebibytes(resources.get("limits", {}).get("memory", "0"))
    if request < concurrency * rss + WORKER_PARENT_MI:
        report.fail(
            where,
            f"{wname}: memory request {request:.0f}Mi below TTS_WORKER_CONCURRENCY {concurrency} x "
            f"TTS_WORKER_MAX_RSS_MB {rss} + {WORKER_PARENT_MI}Mi",
        )
    if limit < concurrency * ceiling + WORKER_PARENT_MI:
        report.fail(
            where,
            f"{wname}: memory limit {limit:.0f}Mi below TTS_WORKER_CONCURRENCY {concurrency} x "
            f"TTS_WORKER_MAX_MEMORY_KB ({ceiling:.0f}Mi) + {WORKER_PARENT_MI}Mi: the kernel would kill a child Celery would recycle",
        )
    gpus = resources.get("limits", {}).get("nvidia.com/gpu")
    if env.get("TTS_WORKER_DEVICE", "cpu").startswith("cuda") and str(gpus) != "1":
        report.fail(where, f"{wname}: a CUDA worker has nvidia.com/gpu: 1 (one worker per GPU)")
    so = scaled.get(workload["metadata"]["name"])
    if so is None:
        report.fail(where, f"{wname}: no KEDA ScaledObject scales this synthesis pool")
        return
    if so["spec"].get("minReplicaCount", 0) == 0:
        declared = {q.strip() for q in env.get("TTS_SCALE_TO_ZERO_QUEUES", "").split(",") if q.strip()}
        undeclared = sorted(set(queues) - declared)
        if undeclared:
            report.fail(
                where,
                f"{name_of(so)} may scale to zero but TTS_SCALE_TO_ZERO_QUEUES lacks {', '.join(undeclared)}: "
                "their submits would answer 503 no_worker and the backlog KEDA scales on would never grow",
            )
    for trigger in so["spec"].get("triggers", []):
        counted = query_engines(str(trigger.get("metadata", {}).get("query", "")))
        if counted is None:
            report.fail(
                where, f"{name_of(so)}: the query is not queued + running jobs of {JOB_TABLE} by engine"
            )
        elif counted != set(engines):
            report.fail(
                where,
                f"{name_of(so)}: the query counts engines {sorted(counted)}, the pool serves {sorted(engines)}",
            )


# ----------------------------------------------------------------------------- checkov


def checkov_skips(path: Path = CHECKOV_SKIPS) -> dict[str, str]:
    data = yaml.safe_load(path.read_text()) or {}
    return {str(k): str(v) for k, v in data.items()}


def run_checkov(tools: Tools, report: Report) -> None:
    """The manifests (plain and kustomize), then the Dockerfile: one run each (checkov given both
    a folder and a file reported on the folder only)."""
    runs = [(["-d", str(K8S.relative_to(ROOT))], ["kubernetes", "kustomize"])]
    if DOCKERFILE.exists():
        runs.append((["-f", str(DOCKERFILE.relative_to(ROOT))], ["dockerfile"]))
    else:
        report.say(f"  checkov: {DOCKERFILE.relative_to(ROOT)} does not exist yet: not scanned")
    for targets, frameworks in runs:
        checkov_once(tools, targets, frameworks, report)


def checkov_once(tools: Tools, targets: list[str], frameworks: list[str], report: Report) -> None:
    skips = checkov_skips()
    command = [tools.checkov, *targets, "--framework", *frameworks, "--compact", "-o", "json"]
    # --skip-download: nothing from checkov's vendor (unreachable here; only guideline links).
    command += ["--skip-download", "--skip-path", "deploy/k8s/schemas"]
    command += ["--skip-check", ",".join(sorted(skips))] if skips else []
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        # checkov's kustomize framework renders with the kubectl beside it.
        env={
            "PATH": str(Path(tools.kubectl).parent) + ":/usr/bin:/bin",
            "HOME": tempfile.gettempdir(),
            "LOG_LEVEL": "WARNING",
        },
    )
    try:
        parsed = json.loads(out.stdout)
    except json.JSONDecodeError:
        report.fail("checkov", f"no JSON report (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
        return
    results = parsed if isinstance(parsed, list) else [parsed]
    seen = set()
    for result in results:
        kind = result.get("check_type", "?")
        seen.add(kind)
        summary = result.get("summary", {})
        checks = result.get("results", {})
        files = sorted(
            {c["file_path"] for part in ("passed_checks", "failed_checks") for c in checks.get(part, [])}
        )
        report.say(
            f"  checkov {kind}: {summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed, "
            f"{len(skips)} check ids skipped (checkov-skips.yaml), {summary.get('resource_count', 0)} resources in "
            f"{len(files)} files: {', '.join(files)}"
        )
        for failed in checks.get("failed_checks", []):
            report.fail(
                f"checkov {kind}",
                f"{failed['check_id']} {failed['check_name']}: {failed['file_path']} {failed.get('resource', '')}",
            )
    for kind in frameworks:
        if kind not in seen:
            report.fail("checkov", f"scanned nothing with the {kind} framework ({' '.join(targets)})")


# ----------------------------------------------------------------------------- main


def validate_overlay(tools: Tools, overlay: Path, report: Report) -> list[Doc]:
    where = str(overlay.relative_to(ROOT))
    report.say(f"{where}:")
    try:
        docs = render(tools, overlay)
    except RenderError as exc:
        report.fail(where, f"kubectl kustomize: {exc}")
        return []
    report.say(f"  kubectl kustomize: {len(docs)} objects")
    kubernetes_validate(tools, docs, where, report)
    crd_validate(docs, where, report)
    problems = project_problems(docs, where)
    report.problems.extend(problems)
    report.say(f"  project rules: {len(problems)} problems")
    return docs


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.validate_k8s")
    parser.add_argument("--tools", type=Path, help="folder of kubectl, kubernetes-validate and checkov")
    parser.add_argument("--overlay", type=Path, action="append", help="only these overlays (default: all)")
    parser.add_argument("--no-checkov", action="store_true", help="leave out the checkov scan")
    args = parser.parse_args(list(argv) if argv is not None else None)
    tools = Tools.find(args.tools)
    report = Report()
    started = time.monotonic()
    secret_docs = load_yaml_docs(SECRET_TEMPLATE)
    report.say(f"{SECRET_TEMPLATE.relative_to(ROOT)}:")
    kubernetes_validate(tools, secret_docs, str(SECRET_TEMPLATE.relative_to(ROOT)), report)
    for overlay in args.overlay or overlays():
        validate_overlay(tools, overlay.resolve(), report)
    if not args.no_checkov:
        run_checkov(tools, report)
    for problem in report.problems:
        print(f"FAIL {problem}", file=sys.stderr)
    verdict = "FAILED" if report.problems else "passed"
    print(f"validate-k8s: {verdict}, {len(report.problems)} problems, {time.monotonic() - started:.1f} s")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
