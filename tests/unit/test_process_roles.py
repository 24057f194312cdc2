"""The table of process roles (deploy/roles.py) against every form that runs them.

The local stack is built from the table; the systemd units, the Dockerfile's targets and the
Kubernetes manifests are written by hand and read back here (deploy/role_forms.py). Each form must
agree today, and each check must notice a changed copy: a queue gone, a role variable changed, a
probe removed, a role with no unit. No service starts; the manifests are read as written (every
overlay rendered is `make validate-k8s`'s, tests/k8s).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from deploy import role_forms, roles
from deploy import stack as deploy_stack
from deploy.provision import StackConfig
from webapp.env import HOUSEKEEPING_QUEUES, WORKER_ENGINES_DEFAULT, worker_queues

Docs = list[role_forms.Doc]


def test_the_tables_queues_are_the_rule_settings_take() -> None:
    """settings.TTS_WORKER_QUEUES comes from webapp/env.py's worker_queues: the same queues."""
    engines = ["piper", "espeak", "kokoro"]
    for role in roles.ROLES:
        if role.worker:
            assert list(role.queues_for(engines)) == worker_queues(role.name, engines), role.name
    assert roles.role("housekeeping").queues == HOUSEKEEPING_QUEUES
    assert ",".join(roles.WORKER_ENGINES_DEFAULT) == WORKER_ENGINES_DEFAULT


def test_every_role_is_named_once_in_each_form() -> None:
    for attr in ("name", "stack_service", "systemd_unit"):
        names = [getattr(r, attr) for r in roles.ROLES if getattr(r, attr)]
        assert len(names) == len(set(names)), attr
    components = [c for r in roles.ROLES for c in r.k8s_components]
    targets = [t for r in roles.ROLES for t in r.image_commands]
    assert len(components) == len(set(components)) and len(targets) == len(set(targets))


# ----------------------------------------------------------------------------- the local stack


@pytest.fixture
def stack_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StackConfig:
    for variable in ("TTS_PG_PASSWORD", "TTS_PG_ADMIN_PASSWORD", "TTS_REDIS_PASSWORD"):
        monkeypatch.setenv(variable, "not-a-secret")
    return StackConfig(var_dir=tmp_path, pg_port=1, redis_port=2, http_port=3, https_port=4)


def test_the_local_stack_runs_every_role_as_the_table_says(stack_cfg: StackConfig) -> None:
    services = deploy_stack.app_services(stack_cfg)
    assert role_forms.stack_problems(services) == []
    assert [s.name for s in services] == [r.stack_service for r in roles.ROLES if r.stack_service]


def test_a_stack_service_that_drifts_is_caught(stack_cfg: StackConfig) -> None:
    services = {s.name: s for s in deploy_stack.app_services(stack_cfg)}
    services["webhooks"].command[services["webhooks"].command.index("-Q") + 1] = "webhooks,default"
    services["analysis"].env["TTS_WORKER_ROLE"] = "synth"
    services["housekeeping"].stop_group = True
    del services["beat"]
    problems = role_forms.stack_problems(services.values())
    assert any("webhooks: consumes -Q webhooks,default" in p for p in problems), problems
    assert any("analysis: TTS_WORKER_ROLE is 'synth'" in p for p in problems), problems
    assert any("housekeeping: stops as a group" in p for p in problems), problems
    assert any("the table's beat is not started" in p for p in problems), problems


def test_a_synthesis_pool_takes_its_queues_from_its_engines(
    stack_cfg: StackConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTS_WORKER_ENGINES", "espeak")
    worker = deploy_stack.worker_service(stack_cfg)
    assert worker.command[worker.command.index("-Q") + 1] == "synth.espeak"
    assert (
        role_forms.command_problems(roles.role("synth"), worker.command, {"TTS_WORKER_ENGINES": "espeak"})
        == []
    )
    assert role_forms.command_problems(roles.role("synth"), worker.command, {}) == [
        "consumes -Q synth.espeak, the table says synth.piper,synth.espeak for TTS_WORKER_ENGINES piper,espeak"
    ]


# ----------------------------------------------------------------------------- systemd


def test_the_systemd_units_are_the_tables() -> None:
    assert role_forms.systemd_problems() == []


def _units_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "systemd"
    shutil.copytree(role_forms.SYSTEMD, folder)
    return folder


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    ("unit", "old", "new", "expected"),
    [
        (
            "tts-housekeeping.service",
            "-Q default,housekeeping",
            "-Q housekeeping",
            "tts-housekeeping.service: consumes -Q housekeeping, the table says default,housekeeping",
        ),
        (
            "tts-worker@.service",
            "TTS_WORKER_ENGINES=%i",
            "TTS_WORKER_ENGINES=espeak",
            "tts-worker@.service: consumes -Q synth.piper, the table says synth.espeak",
        ),
        (
            "tts-webhooks.service",
            "TTS_WORKER_ROLE=webhooks",
            "TTS_WORKER_ROLE=synth",
            "tts-webhooks.service: TTS_WORKER_ROLE is 'synth', the table says 'webhooks'",
        ),
        (
            "tts-analysis.service",
            " --loglevel INFO",
            "",
            "tts-analysis.service: runs `celery -A webapp worker --pool prefork",
        ),
        ("tts-analysis.service", "KillMode=mixed", "KillMode=control-group", "KillMode must be mixed"),
        ("tts-webhooks.service", "TimeoutStopSec=90", "TimeoutStopSec=60", "TimeoutStopSec 60 must exceed"),
        (
            "tts-beat.service",
            "TTS_PROCESS_NAME=beat",
            "TTS_PROCESS_NAME=housekeeping",
            "tts-beat.service: TTS_PROCESS_NAME is 'housekeeping', the table says 'beat'",
        ),
        (
            "tts-web.service",
            "--config /opt/tts/deploy/gunicorn.conf.py",
            "--config /opt/tts/deploy/other.conf.py",
            "tts-web.service: runs `gunicorn --config /opt/tts/deploy/other.conf.py`",
        ),
    ],
)
def test_a_unit_that_drifts_is_caught(tmp_path: Path, unit: str, old: str, new: str, expected: str) -> None:
    folder = _units_copy(tmp_path)
    _edit(folder / unit, old, new)
    problems = role_forms.systemd_problems(folder)
    assert any(p.startswith(expected) or expected in p for p in problems), problems


def test_a_role_without_its_unit_and_a_unit_without_a_role_are_caught(tmp_path: Path) -> None:
    folder = _units_copy(tmp_path)
    (folder / "tts-webhooks.service").rename(folder / "tts-mailer.service")
    assert role_forms.systemd_problems(folder) == [
        "tts-mailer.service: no role of the table runs as this unit",
        "tts-webhooks.service: the table's webhooks has no unit",
    ]


# ----------------------------------------------------------------------------- the Dockerfile


def test_the_dockerfiles_targets_are_the_tables() -> None:
    assert role_forms.dockerfile_problems() == []
    stages = role_forms.read_dockerfile()
    assert stages["worker-gpu"].env["TTS_WORKER_ENGINES"] == "piper"
    assert stages["worker"].env["DJANGO_SETTINGS_MODULE"] == "webapp.settings"  # from the runtime stage


def _dockerfile_after(tmp_path: Path, old: str, new: str) -> list[str]:
    path = tmp_path / "Dockerfile"
    shutil.copy(role_forms.DOCKERFILE, path)
    _edit(path, old, new)
    return role_forms.dockerfile_problems(path)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            '"-Q", "analysis"',
            '"-Q", "analysis,default"',
            "target analysis: consumes -Q analysis,default, the table says analysis",
        ),
        (
            "ENV TTS_WORKER_ROLE=analysis\n",
            "",
            "target analysis: TTS_WORKER_ROLE is 'synth', the table says 'analysis'",
        ),
        (
            "    TTS_WORKER_ENGINES=piper\n",
            "    TTS_WORKER_PIN=1\n",
            "target worker-gpu: consumes -Q synth.piper, the table says synth.piper,synth.espeak",
        ),
        ('CMD ["gunicorn", "--config"', 'CMD ["uvicorn", "--config"', "target web: runs `uvicorn --config"),
        (
            'ENTRYPOINT ["python3", "/app/deploy/container/edge.py"]',
            'ENTRYPOINT ["nginx"]',
            "target edge: ENTRYPOINT ['nginx']",
        ),
        (
            "FROM venv-web AS web\n",
            "FROM venv-web AS site\n",
            "target site: no role of the table is its command",
        ),
    ],
)
def test_a_target_that_drifts_is_caught(tmp_path: Path, old: str, new: str, expected: str) -> None:
    problems = _dockerfile_after(tmp_path, old, new)
    assert any(p.startswith(expected) for p in problems), problems


# ----------------------------------------------------------------------------- Kubernetes


def test_the_kubernetes_manifests_are_the_tables() -> None:
    files = {p.relative_to(role_forms.K8S).as_posix() for p in role_forms.k8s_files()}
    assert {"base/web.yaml", "base/worker-cpu.yaml", "overlays/gpu/worker-gpu.yaml"} <= files
    assert role_forms.k8s_file_problems() == []


@pytest.fixture(scope="module")
def k8s_docs() -> Docs:
    return role_forms.load_docs(role_forms.k8s_files())


def _deployment(docs: Docs, name: str) -> role_forms.Doc:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def _container(docs: Docs, name: str) -> role_forms.Doc:
    container: role_forms.Doc = _deployment(docs, name)["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: role_forms.Doc, name: str, value: str) -> None:
    next(e for e in container["env"] if e["name"] == name)["value"] = value


def _drop_probe(kind: str) -> Callable[[Docs], None]:
    return lambda docs: _container(docs, "tts-worker-cpu").pop(kind)


def _set_queue(docs: Docs) -> None:
    command = _container(docs, "tts-housekeeping")["command"]
    command[command.index("-Q") + 1] = "housekeeping"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            _set_queue,
            "Deployment tts-housekeeping: consumes -Q housekeeping, the table says default,housekeeping",
        ),
        (
            lambda docs: _env(_container(docs, "tts-worker-gpu"), "TTS_WORKER_ENGINES", "piper,espeak"),
            "Deployment tts-worker-gpu: consumes -Q synth.piper, the table says synth.piper,synth.espeak",
        ),
        (
            lambda docs: _env(_container(docs, "tts-analysis"), "TTS_WORKER_ROLE", "synth"),
            "Deployment tts-analysis: TTS_WORKER_ROLE is 'synth', the table says 'analysis'",
        ),
        (_drop_probe("readinessProbe"), "Deployment tts-worker-cpu: probes: missing [('readiness'"),
        (
            lambda docs: _container(docs, "tts-web")["readinessProbe"]["httpGet"].update(path="/healthz"),
            "Deployment tts-web: probes: missing [('readiness', 'http: /healthz/ready')]",
        ),
        (
            lambda docs: _container(docs, "tts-webhooks").update(image="tts-web"),
            "Deployment tts-webhooks: runs image tts-web, the table says one of tts-worker",
        ),
        (
            lambda docs: _deployment(docs, "tts-webhooks")["spec"]["template"]["spec"].update(
                terminationGracePeriodSeconds=30
            ),
            "Deployment tts-webhooks: terminationGracePeriodSeconds 30 must exceed",
        ),
        (
            lambda docs: docs.remove(_deployment(docs, "tts-beat")),
            "no Deployment runs the table's beat",
        ),
        (
            lambda docs: _container(docs, "tts-beat")["command"].remove("--loglevel"),
            "Deployment tts-beat: runs `celery -A webapp beat INFO",
        ),
    ],
)
def test_a_manifest_that_drifts_is_caught(
    k8s_docs: Docs, change: Callable[[Docs], None], expected: str
) -> None:
    docs = copy.deepcopy(k8s_docs)
    change(docs)
    problems = role_forms.k8s_problems(docs, complete=True)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_deployment_of_no_role_is_caught_and_the_data_services_are_not_roles(k8s_docs: Docs) -> None:
    docs = copy.deepcopy(k8s_docs)
    extra = copy.deepcopy(_deployment(docs, "tts-webhooks"))
    extra["metadata"]["name"] = "tts-mailer"
    extra["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] = "mailer"
    redis = copy.deepcopy(extra)
    redis["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] = "redis"
    assert role_forms.k8s_problems([*docs, extra, redis]) == [
        "Deployment tts-mailer: component 'mailer' is no role's in the table"
    ]
