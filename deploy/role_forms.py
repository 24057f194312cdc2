"""The deployment forms read back and checked against the table of process roles (deploy/roles.py).

The systemd units (deploy/systemd/), the Dockerfile's targets (deploy/container/Dockerfile) and the
Kubernetes manifests (deploy/k8s/: the base and each overlay's own files as written, or an overlay
as `kubectl kustomize` renders it, deploy/validate_k8s.py) are written by hand; each reader here
turns one into what the table says (a command, an environment, probes) and each ``*_problems``
names where it differs: a role missing or extra, another queue, command or role variable, a probe
missing, a stop that would cut running jobs off. The local stack needs no reader: it is built from
the table (deploy/stack.py), and tests/unit/test_process_roles.py checks what it builds all the same.

Standard library and PyYAML only (the validators' venv runs it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deploy.roles import (
    DATA_SERVICES,
    ENGINE,
    NODE,
    QUEUES,
    ROLES,
    WORKER_ENGINES_DEFAULT,
    WORKER_ROLE_DEFAULT,
    CheckoutPath,
    Probe,
    Role,
    stop_timeout_floor,
)

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "deploy" / "systemd"
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
# The Django images' entry point: prepare_var, then the command (a wrapper, not part of the role).
IMAGE_ENTRYPOINT = ("/app/deploy/container/entrypoint.sh",)
# The engine a template unit (tts-worker@.service) is read for.
UNIT_INSTANCE = "piper"

Doc = dict[str, Any]


# ----------------------------------------------------------------------------- comparing with the table


def normalised(argv: Sequence[str], role: Role) -> list[str]:
    """``argv`` as the table writes it: the program's name without its folder, ``--opt=value`` as
    two words, the role's placed options gone, a checkout's file by its path in the checkout."""
    words: list[str] = []
    for i, arg in enumerate(argv):
        if i == 0:
            arg = arg.rsplit("/", 1)[-1]
        if arg.startswith("--") and "=" in arg:
            words += arg.split("=", 1)
        else:
            words.append(arg)
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in role.placed:
            skip = True
        else:
            out.append(word)
    return out


def _same_word(expected: str, found: str) -> bool:
    if isinstance(expected, CheckoutPath):
        return found == expected or found.endswith("/" + expected)
    return found == expected


def engines_of(env: Mapping[str, str]) -> list[str]:
    raw = env.get("TTS_WORKER_ENGINES", "").strip()
    if not raw:
        return list(WORKER_ENGINES_DEFAULT)
    return [e.strip() for e in raw.split(",") if e.strip()]


def command_problems(role: Role, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """How ``argv`` (run with ``env``, the form's environment) differs from the role's command."""
    found = normalised(argv, role)
    expected = list(role.command)
    said = shlex.join(role.argv(engines_of(env), node="<pool>"))
    problems: list[str] = []
    if len(found) != len(expected):
        return [f"runs `{shlex.join(found)}`, the table says `{said}`"]
    for want, got in zip(expected, found, strict=True):
        if want == QUEUES:
            queues = role.queues_for(engines_of(env))
            if sorted(got.split(",")) != sorted(queues):
                problems.append(
                    f"consumes -Q {got}, the table says {','.join(queues)}"
                    + (
                        f" for TTS_WORKER_ENGINES {','.join(engines_of(env))}"
                        if ENGINE in "".join(role.queues)
                        else ""
                    )
                )
        elif NODE in want:
            tail = want.split(NODE, 1)[1]
            if not got.endswith(tail) or not got[: -len(tail)].replace("-", "").replace("_", "").isalnum():
                problems.append(f"node name {got}: the table says <pool>{tail}")
        elif not _same_word(want, got):
            problems.append(f"runs `{shlex.join(found)}`, the table says `{said}` ({got!r} for {want!r})")
            break
    return problems


def env_problems(role: Role, env: Mapping[str, str], process_name: bool = True) -> list[str]:
    """The role's variables in ``env`` (a form's environment; unset ones take the settings' default);
    ``process_name``: the form names the process (TTS_PROCESS_NAME) too."""
    problems = []
    worker_role = env.get("TTS_WORKER_ROLE", WORKER_ROLE_DEFAULT)
    for name, value in role.env.items():
        got = env.get(name, WORKER_ROLE_DEFAULT if name == "TTS_WORKER_ROLE" else None)
        if got != value:
            problems.append(f"{name} is {got!r}, the table says {value!r}")
    if not role.worker and "TTS_WORKER_ROLE" in env:
        problems.append(f"TTS_WORKER_ROLE={worker_role} set on a process that is no Celery worker")
    if process_name and role.django:
        name = env.get("TTS_PROCESS_NAME", "")
        if name != role.process_name and not (role.name == "synth" and name.startswith("worker-")):
            problems.append(f"TTS_PROCESS_NAME is {name!r}, the table says {role.process_name!r}")
    return problems


def probe_problems(role: Role, probes: Sequence[Probe]) -> list[str]:
    """The probes a form declares against the role's (Kubernetes: the only form that probes)."""
    want = sorted((p.when, p.check) for p in role.probes)
    got = sorted((p.when, p.check) for p in probes)
    if want == got:
        return []
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    return [f"probes: missing {missing}, not in the table {extra}"]


# ----------------------------------------------------------------------------- systemd


@dataclass
class Unit:
    name: str
    argv: list[str]
    env: dict[str, str]
    options: dict[str, str]


def read_unit(path: Path, instance: str = UNIT_INSTANCE) -> Unit:
    """A unit's [Service] section; a template's %i is ``instance``, %% a percent sign."""
    env: dict[str, str] = {}
    options: dict[str, str] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.replace("%i", instance).replace("%%", "%")
        if key == "Environment":
            for item in shlex.split(value):
                name, _, val = item.partition("=")
                env[name] = val
        else:
            options[key] = value
    argv = shlex.split(options.get("ExecStart", ""))
    return Unit(path.name, argv, env, options)


def systemd_problems(folder: Path = SYSTEMD) -> list[str]:
    units = {p.name: p for p in folder.glob("*.service")}
    table = {r.systemd_unit: r for r in ROLES if r.systemd_unit}
    problems = [f"{name}: no role of the table runs as this unit" for name in sorted(set(units) - set(table))]
    problems += [
        f"{name}: the table's {table[name].name} has no unit" for name in sorted(set(table) - set(units))
    ]
    for name in sorted(set(units) & set(table)):
        role, unit = table[name], read_unit(units[name])
        found = command_problems(role, unit.argv, unit.env) + env_problems(role, unit.env)
        if role.warm_stop:
            found += warm_stop_unit_problems(unit)
        problems += [f"{name}: {p}" for p in found]
    return problems


def warm_stop_unit_problems(unit: Unit) -> list[str]:
    problems = []
    if unit.options.get("KillMode") != "mixed":
        problems.append("KillMode must be mixed: SIGTERM to the Celery parent alone is its warm stop")
    if unit.options.get("KillSignal", "SIGTERM") != "SIGTERM":
        problems.append(f"KillSignal {unit.options['KillSignal']}: the warm stop is SIGTERM")
    timeout = unit.options.get("TimeoutStopSec", "90")
    if not timeout.isdigit() or int(timeout) <= stop_timeout_floor():
        problems.append(
            f"TimeoutStopSec {timeout} must exceed TTS_WORKER_STOP_GRACE + the margin ({stop_timeout_floor()} s)"
        )
    return problems


# ----------------------------------------------------------------------------- the Dockerfile


@dataclass
class Stage:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None
    runs: bool = False  # sets its own command (CMD or ENTRYPOINT): an image one runs


def _instructions(text: str) -> Iterable[tuple[str, str]]:
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") and not logical:
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        if logical.strip():
            word, _, rest = logical.strip().partition(" ")
            yield word.upper(), rest.strip()
        logical = ""


def read_dockerfile(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """Its stages by name, each with the environment, CMD and ENTRYPOINT it inherits and sets."""
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for word, rest in _instructions(path.read_text()):
        if word == "FROM":
            parts = rest.split()
            base = stages.get(parts[0])
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else parts[0]
            stage = Stage(name)
            if base is not None:
                stage.env, stage.cmd, stage.entrypoint = dict(base.env), base.cmd, base.entrypoint
            stages[name] = stage
        elif stage is None:
            continue
        elif word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                stage.env[key] = value
        elif word in ("CMD", "ENTRYPOINT"):
            argv = json.loads(rest)
            stage.runs = True
            if word == "CMD":
                stage.cmd = argv
            else:
                stage.entrypoint, stage.cmd = argv, None  # a new ENTRYPOINT drops the inherited CMD
    return stages


def dockerfile_problems(path: Path = DOCKERFILE) -> list[str]:
    stages = read_dockerfile(path)
    table = {target: r for r in ROLES for target in r.image_commands}
    images = {name for name, stage in stages.items() if stage.runs}
    problems = [f"target {t}: no role of the table is its command" for t in sorted(images - set(table))]
    problems += [
        f"target {t}: the table's {table[t].name} runs it, the Dockerfile has no such image"
        for t in sorted(set(table) - images)
    ]
    for r in ROLES:
        problems += [
            f"{r.name}: runs from image {i}, which the Dockerfile does not build"
            for i in r.images
            if i not in stages
        ]
    for target in sorted(images & set(table)):
        role, stage = table[target], stages[target]
        found: list[str] = []
        if role.image_launcher:
            launcher = normalised(stage.entrypoint or [], role)
            if len(launcher) != len(role.image_launcher) or not all(
                _same_word(w, g) for w, g in zip(role.image_launcher, launcher, strict=False)
            ):
                found.append(f"ENTRYPOINT {stage.entrypoint}, the table says {list(role.image_launcher)}")
        else:
            if tuple(stage.entrypoint or ()) != IMAGE_ENTRYPOINT:
                found.append(f"ENTRYPOINT {stage.entrypoint}: the Django images run {IMAGE_ENTRYPOINT[0]}")
            found += command_problems(role, stage.cmd or [], stage.env)
        found += env_problems(role, stage.env, process_name=False)
        problems += [f"target {target}: {p}" for p in found]
    return problems


# ----------------------------------------------------------------------------- Kubernetes


def k8s_files() -> list[Path]:
    """The base's resources and each overlay's own files, as written (no patch applied)."""
    files = []
    for kustomization in sorted(
        [K8S / "base" / "kustomization.yaml", *K8S.glob("overlays/*/kustomization.yaml")]
    ):
        for entry in yaml.safe_load(kustomization.read_text()).get("resources", []):
            path = (kustomization.parent / entry).resolve()
            if path.is_file():
                files.append(path)
    return files


def load_docs(paths: Iterable[Path]) -> list[Doc]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def probes_of(container: Doc) -> list[Probe]:
    found = []
    for when in ("startup", "liveness", "readiness"):
        probe = container.get(f"{when}Probe")
        if not probe:
            continue
        if "exec" in probe:
            check = "exec: " + " ".join(str(a) for a in probe["exec"].get("command", []))
        elif "httpGet" in probe:
            check = f"http: {probe['httpGet'].get('path', '/')}"
        elif "tcpSocket" in probe:
            check = f"tcp: {probe['tcpSocket'].get('port')}"
        else:
            check = f"? {sorted(probe)}"
        found.append(Probe(when, check))  # type: ignore[arg-type]
    return found


def container_env(container: Doc) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def k8s_problems(docs: Sequence[Doc], complete: bool = False) -> list[str]:
    """Each Deployment against its role (by its component label); ``complete``: ``docs`` is an
    overlay as rendered, so every role with a component must be there too (the CPU or the GPU
    pool standing for the synthesis role)."""
    table = {c: r for r in ROLES for c in r.k8s_components}
    problems: list[str] = []
    seen: set[str] = set()
    for doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        name = doc["metadata"]["name"]
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        component = labels.get("app.kubernetes.io/component", "")
        role = table.get(component)
        if role is None and component in DATA_SERVICES:
            continue
        if role is None:
            problems.append(f"Deployment {name}: component {component!r} is no role's in the table")
            continue
        seen.add(role.name)
        pod = doc["spec"]["template"]["spec"]
        container = pod["containers"][0]
        found = env_problems(role, container_env(container))
        image = str(container.get("image", "")).rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
        if image.removeprefix("tts-") not in role.images:
            found.append(
                f"runs image {image}, the table says one of {', '.join('tts-' + i for i in role.images)}"
            )
        if "command" in container:
            found += command_problems(role, [str(a) for a in container["command"]], container_env(container))
        elif image.removeprefix("tts-") not in role.image_commands:
            found.append(f"no command, and image {image}'s is not the role's")
        found += probe_problems(role, probes_of(container))
        if role.warm_stop:
            period = int(pod.get("terminationGracePeriodSeconds", 30))
            if period <= stop_timeout_floor():
                found.append(
                    f"terminationGracePeriodSeconds {period} must exceed TTS_WORKER_STOP_GRACE + the margin "
                    f"({stop_timeout_floor()} s)"
                )
        problems += [f"Deployment {name}: {p}" for p in found]
    if complete:
        missing = sorted(r.name for r in ROLES if r.k8s_components and r.name not in seen)
        problems += [f"no Deployment runs the table's {m}" for m in missing]
    return problems


def k8s_file_problems() -> list[str]:
    """The base and the overlays' own files: every component of the table there, each as the table says."""
    docs = load_docs(k8s_files())
    problems = k8s_problems(docs, complete=True)
    components = {
        str(d["spec"]["template"]["metadata"].get("labels", {}).get("app.kubernetes.io/component"))
        for d in docs
        if d.get("kind") == "Deployment"
    }
    for r in ROLES:
        problems += [
            f"the table's {r.name}: no Deployment of component {c}"
            for c in r.k8s_components
            if c not in components
        ]
    return problems


def stack_problems(services: Iterable[Any]) -> list[str]:
    """The local stack's services (deploy/supervisor.py Service) against their roles."""
    table = {r.stack_service: r for r in ROLES if r.stack_service}
    by_name = {s.name: s for s in services}
    problems = [f"stack: {n}: no role of the table" for n in sorted(set(by_name) - set(table))]
    problems += [
        f"stack: the table's {table[n].name} is not started" for n in sorted(set(table) - set(by_name))
    ]
    for name in sorted(set(by_name) & set(table)):
        role, service = table[name], by_name[name]
        found = command_problems(role, service.command, service.env)
        if role.django:
            found += env_problems(role, service.env)
        if role.warm_stop and service.stop_group:
            found.append("stops as a group: a warm stop signals the Celery parent alone")
        if bool(role.missing_means) == service.required:
            found.append(
                f"required is {service.required}, the table says {'optional' if role.missing_means else 'required'}"
            )
        problems += [f"stack: {name}: {p}" for p in found]
    return problems
