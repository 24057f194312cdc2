"""deploy/k8s: every overlay renders and passes the validators, and the validators catch the bad cases.

The same checks as `make validate-k8s` (deploy/validate_k8s.py); the bad cases change one thing in
a rendered overlay (or write an overlay that does) and expect the validators to name it.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from deploy import validate_k8s as validate

Docs = list[validate.Doc]


def find(docs: Docs, kind: str, name: str) -> validate.Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container(docs: Docs, workload: str, name: str, kind: str = "Deployment") -> validate.Doc:
    pod = find(docs, kind, workload)["spec"]["template"]["spec"]
    return next(c for c in validate.containers(pod) if c["name"] == name)


def problems_after(rendered: dict[str, Docs], overlay: str, change: Callable[[Docs], None]) -> list[str]:
    docs = copy.deepcopy(rendered[overlay])
    change(docs)
    return validate.project_problems(docs, overlay)


def test_every_overlay_renders_and_validates(k8s_tools: validate.Tools) -> None:
    report = validate.Report()
    validate.kubernetes_validate(
        k8s_tools, validate.load_yaml_docs(validate.SECRET_TEMPLATE), "secret", report
    )
    names = []
    for overlay in validate.overlays():
        names.append(overlay.name)
        validate.validate_overlay(k8s_tools, overlay, report)
    assert {"local", "gpu"} <= set(names)
    assert report.problems == []
    assert any("kubernetes-validate 1.33.0 --strict" in line for line in report.lines)
    assert any(re.search(r"jsonschema .*: [1-9]", line) for line in report.lines)


def test_checkov_scans_manifests_and_dockerfile_and_finds_nothing_unjustified(
    k8s_tools: validate.Tools,
) -> None:
    report = validate.Report()
    validate.run_checkov(k8s_tools, report)
    assert report.problems == []
    text = "\n".join(report.lines)
    assert re.search(r"checkov kubernetes: [1-9]\d* passed, 0 failed.*base/worker-cpu\.yaml", text)
    assert re.search(r"checkov kustomize: [1-9]\d* passed, 0 failed.*overlays/gpu/kustomization\.yaml", text)
    if validate.DOCKERFILE.exists():
        assert re.search(r"checkov dockerfile: [1-9]\d* passed, 0 failed.*deploy/container/Dockerfile", text)


def test_the_skip_list_is_the_one_docs_scaling_gives() -> None:
    skips = validate.checkov_skips()
    assert all(reason.strip() for reason in skips.values())
    section = (
        (validate.ROOT / "docs" / "scaling.md").read_text().split("## checkov", 1)[1].split("\n## ", 1)[0]
    )
    assert set(re.findall(r"`(CKV2?_[A-Z0-9_]+)`", section)) == set(skips)


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("localhost/tts-web:latest", "latest"),
        ("localhost/tts-web", "no tag"),
        ("localhost/tts-web:main", "not a release tag"),
        ("registry.example.com:5000/tts/tts-web", "no tag"),
    ],
)
def test_a_wrong_image_tag_is_caught(rendered: dict[str, Docs], image: str, why: str) -> None:
    def change(docs: Docs) -> None:
        container(docs, "tts-web", "web")["image"] = image

    problems = problems_after(rendered, "local", change)
    assert any("tts-web web: image" in p and why in p for p in problems), problems


def test_release_tags_and_digests_pass() -> None:
    for image in ("tts-web:0.1.0", "r.example.com:5000/tts/tts-web:1.2.3-rc.1", "postgres:16.4-bookworm"):
        assert validate.check_image(image) is None, image
    assert validate.check_image("tts-web@sha256:" + "a" * 64) is None


def test_keda_reading_the_apps_secret_is_caught(rendered: dict[str, Docs]) -> None:
    """KEDA's operator, in its own namespace, would read the secret key and the API keys' HMAC secret."""

    def change(docs: Docs) -> None:
        auth = next(d for d in docs if d["kind"] == "TriggerAuthentication")
        auth["spec"]["secretTargetRef"][0]["name"] = "tts-secrets"

    keys = validate.secret_template_keys()
    keys["tts-secrets"].add("KEDA_DATABASE_URL")  # as the example had it before
    docs = copy.deepcopy(rendered["gpu"])
    change(docs)
    problems = validate.project_problems(docs, "gpu", keys)
    assert any(
        "KEDA reads Secret tts-secrets, which also holds" in p and "DJANGO_SECRET_KEY" in p for p in problems
    )
    assert not any("KEDA reads" in p for p in validate.project_problems(rendered["gpu"], "gpu"))


def test_a_missing_secret_key_is_caught(rendered: dict[str, Docs]) -> None:
    def change(docs: Docs) -> None:
        env = container(docs, "tts-worker-cpu", "worker")["env"]
        ref = next(e for e in env if e["name"] == "REDIS_URL")["valueFrom"]["secretKeyRef"]
        ref["key"] = "REDIS_URI"

    problems = problems_after(rendered, "gpu", change)
    assert any("env REDIS_URL: a key 'REDIS_URI' that Secret tts-secrets" in p for p in problems), problems


def test_a_secret_key_missing_from_the_template_is_caught(rendered: dict[str, Docs]) -> None:
    keys = validate.secret_template_keys()
    keys["tts-keda"].discard("KEDA_DATABASE_URL")
    problems = validate.project_problems(rendered["gpu"], "gpu", keys)
    assert any("TriggerAuthentication/tts-keda-postgres" in p and "KEDA_DATABASE_URL" in p for p in problems)


def test_an_overlay_with_a_wrong_tag_and_a_missing_secret_key_fails(
    k8s_tools: validate.Tools, tmp_path: Path
) -> None:
    """End to end: a real overlay on the real base, rendered by kubectl, then checked."""
    tree = tmp_path / "k8s"
    shutil.copytree(validate.K8S, tree, ignore=shutil.ignore_patterns("schemas"))
    bad = tree / "overlays" / "bad"
    bad.mkdir()
    (bad / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["../local"],
                "images": [{"name": "localhost/tts-worker", "newTag": "latest"}],
                "patches": [
                    {
                        "target": {"kind": "Deployment", "name": "tts-web"},
                        "patch": "- op: add\n  path: /spec/template/spec/containers/0/env/-\n  value:\n"
                        "    name: TTS_API_KEY_SECRET\n    valueFrom:\n      secretKeyRef:\n"
                        "        name: tts-secrets\n        key: API_KEY_SECRET\n",
                    }
                ],
            }
        )
    )
    problems = validate.project_problems(validate.render(k8s_tools, bad), "bad")
    assert any("tts-worker-cpu worker: image 'localhost/tts-worker:latest'" in p for p in problems), problems
    assert any("'API_KEY_SECRET' that Secret tts-secrets" in p for p in problems), problems


def test_a_broken_overlay_does_not_render(k8s_tools: validate.Tools, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    with pytest.raises(validate.RenderError):
        validate.render(k8s_tools, tmp_path)


def test_worker_rules(rendered: dict[str, Docs]) -> None:
    def short_grace(docs: Docs) -> None:
        find(docs, "Deployment", "tts-worker-gpu")["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ] = 60

    def other_queue(docs: Docs) -> None:
        container(docs, "tts-worker-cpu", "worker")["command"][9] = "synth.piper"

    def other_query(docs: Docs) -> None:
        so = find(docs, "ScaledObject", "tts-worker-gpu")
        so["spec"]["triggers"][0]["metadata"]["query"] = so["spec"]["triggers"][0]["metadata"][
            "query"
        ].replace("'piper'", "'espeak'")

    def small_memory(docs: Docs) -> None:
        container(docs, "tts-worker-cpu", "worker")["resources"]["limits"]["memory"] = "3Gi"

    def redis_probe(docs: Docs) -> None:
        container(docs, "tts-worker-cpu", "worker")["livenessProbe"] = {
            "exec": {"command": ["redis-cli", "ping"]}
        }

    def no_gpu(docs: Docs) -> None:
        del container(docs, "tts-worker-gpu", "worker")["resources"]["limits"]["nvidia.com/gpu"]

    def zero_undeclared(docs: Docs) -> None:
        settings = next(
            d["metadata"]["name"]
            for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tts-settings")
        )
        find(docs, "ConfigMap", settings)["data"].pop("TTS_SCALE_TO_ZERO_QUEUES")

    cases: list[tuple[Callable[[Docs], None], str]] = [
        (short_grace, "terminationGracePeriodSeconds 60 must exceed TTS_WORKER_STOP_GRACE 60 + 15"),
        (other_queue, "-Q synth.piper does not match TTS_WORKER_ENGINES espeak"),
        (other_query, "the query counts engines ['espeak'], the pool serves ['piper']"),
        (small_memory, "memory limit 3072Mi below TTS_WORKER_CONCURRENCY 2"),
        (redis_probe, "livenessProbe must be `python -m webapp.speech.runtime.probe live`"),
        (no_gpu, "a CUDA worker has nvidia.com/gpu: 1"),
        (zero_undeclared, "may scale to zero but TTS_SCALE_TO_ZERO_QUEUES lacks synth.piper"),
    ]
    for change, expected in cases:
        problems = problems_after(rendered, "gpu", change)
        assert any(expected in p for p in problems), (change.__name__, problems)


def test_the_voxcpm_pool_reads_its_model_from_a_read_only_volume_and_scales_on_its_queue(
    rendered: dict[str, Docs],
) -> None:
    docs = rendered["gpu"]
    pod = find(docs, "Deployment", "tts-worker-voxcpm")["spec"]["template"]["spec"]
    worker = container(docs, "tts-worker-voxcpm", "worker")
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["TTS_WORKER_ENGINES"] == "voxcpm" and env["TTS_WORKER_DEVICE"] == "cuda"
    assert validate.arg_after([str(a) for a in worker["command"]], "-Q") == "synth.voxcpm"
    assert worker["image"].split("/")[-1].startswith("tts-worker-gpu:")
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v["name"] == "models")
    assert mounts["models"]["mountPath"] == env["TTS_MODELS_DIR"] and mounts["models"]["readOnly"] is True
    assert volume["persistentVolumeClaim"] == {"claimName": "tts-models", "readOnly": True}
    assert find(docs, "PersistentVolumeClaim", "tts-models")["spec"]["accessModes"] == ["ReadOnlyMany"]
    query = find(docs, "ScaledObject", "tts-worker-voxcpm")["spec"]["triggers"][0]["metadata"]["query"]
    assert validate.query_engines(query) == {"voxcpm"}


def test_the_remote_pool_relays_cosyvoice3_from_its_models_file(rendered: dict[str, Docs]) -> None:
    """The gpu overlay's relay for CosyVoice3 served by vLLM-Omni (docs/scaling.md): its engine, its
    queue and its KEDA query agree, its models file is mounted from the generated ConfigMap, and its
    models file names only http(s) upstreams a worker can read."""
    import json

    docs = rendered["gpu"]
    worker = container(docs, "tts-worker-remote", "worker")
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["TTS_WORKER_ENGINES"] == "cosyvoice3" and "synth.cosyvoice3" in worker["command"]
    assert "nvidia.com/gpu" not in worker["resources"]["limits"]  # the GPU is the upstream's
    mount = next(m for m in worker["volumeMounts"] if m["name"] == "remote-models")
    assert env["TTS_REMOTE_MODELS_FILE"].startswith(mount["mountPath"] + "/") and mount["readOnly"]
    pod = find(docs, "Deployment", "tts-worker-remote")["spec"]["template"]["spec"]
    config = next(v for v in pod["volumes"] if v["name"] == "remote-models")["configMap"]["name"]
    models = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == config)["data"]
    parsed = json.loads(models["remote-models.json"])["models"]["cosyvoice3"]
    assert all(u.startswith("http") for u in parsed["upstreams"]) and parsed["cloning"] is True
    backlog = find(docs, "ScaledObject", "tts-worker-remote")["spec"]["triggers"][0]["metadata"]
    assert validate.query_engines(backlog["query"]) == {"cosyvoice3"}
    # A pod relays its children x jobs_per_process jobs at once: KEDA adds a pod per that many.
    capacity = int(env["TTS_WORKER_CONCURRENCY"]) * parsed["jobs_per_process"]
    assert int(backlog["targetQueryValue"]) == capacity


def test_exactly_the_data_clients_reach_postgresql_and_redis(rendered: dict[str, Docs]) -> None:
    for overlay, docs in rendered.items():
        labelled = {
            validate.pod_labels(w)["app.kubernetes.io/component"]
            for w, _ in validate.pod_specs(docs)
            if validate.pod_labels(w).get(validate.DATA_CLIENT_LABEL) == "true"
        }
        workers = (
            {"worker-cpu", "worker-gpu", "worker-voxcpm", "worker-remote"}
            if overlay == "gpu"
            else {"worker-cpu"}
        )
        assert labelled == validate.DATA_CLIENTS | workers, overlay

    def edge_too(docs: Docs) -> None:
        find(docs, "Deployment", "tts-edge")["spec"]["template"]["metadata"]["labels"][
            validate.DATA_CLIENT_LABEL
        ] = "true"

    problems = problems_after(rendered, "local", edge_too)
    assert any("extra ['edge']" in p for p in problems), problems


def test_other_rules(rendered: dict[str, Docs]) -> None:
    def typo_setting(docs: Docs) -> None:
        next(
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tts-settings")
        )["data"]["TTS_WORKER_STOP_GRAC"] = "60"

    def beat_rolling(docs: Docs) -> None:
        find(docs, "Deployment", "tts-beat")["spec"]["strategy"] = {"type": "RollingUpdate"}

    def root_fs(docs: Docs) -> None:
        container(docs, "tts-edge", "edge")["securityContext"]["readOnlyRootFilesystem"] = False

    def web_probe(docs: Docs) -> None:
        container(docs, "tts-web", "web")["readinessProbe"]["httpGet"]["path"] = "/healthz"

    def default_namespace(docs: Docs) -> None:
        find(docs, "Service", "tts-web")["metadata"]["namespace"] = "default"

    def web_without_pause(docs: Docs) -> None:
        del container(docs, "tts-web", "web")["lifecycle"]

    def edge_grace_short(docs: Docs) -> None:
        find(docs, "Deployment", "tts-edge")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60

    def web_grace_short(docs: Docs) -> None:
        find(docs, "Deployment", "tts-web")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 20

    cases: list[tuple[Callable[[Docs], None], str]] = [
        (typo_setting, "TTS_WORKER_STOP_GRAC is not a setting in the README's table"),
        (beat_rolling, "beat runs as 1 replica with the Recreate strategy"),
        (root_fs, "tts-edge edge: needs readOnlyRootFilesystem"),
        (web_probe, "readinessProbe is GET /healthz/ready"),
        (default_namespace, "Service/tts-web: no namespace"),
        (web_without_pause, "tts-web web: needs a preStop exec [sleep, N]"),
        (
            edge_grace_short,
            "tts-edge: terminationGracePeriodSeconds 60 must be at least the preStop sleep 5 + Nginx's",
        ),
        (
            web_grace_short,
            "tts-web: terminationGracePeriodSeconds 20 must be at least the preStop sleep 5 + gunicorn's",
        ),
    ]
    for change, expected in cases:
        problems = problems_after(rendered, "local", change)
        assert any(expected in p for p in problems), (change.__name__, problems)


def test_an_edge_that_would_hide_client_addresses_is_caught(rendered: dict[str, Docs]) -> None:
    def source_rewritten(docs: Docs) -> None:
        find(docs, "Service", "tts-edge")["spec"]["externalTrafficPolicy"] = "Cluster"

    def balancer_trusted(docs: Docs) -> None:
        source_rewritten(docs)
        next(
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tts-settings")
        )["data"]["TTS_NGINX_REAL_IP_FROM"] = "10.30.0.0/16"

    assert find(rendered["gpu"], "Service", "tts-edge")["spec"]["externalTrafficPolicy"] == "Local"
    hidden = problems_after(rendered, "gpu", source_rewritten)
    assert any("tts-edge: exposed with externalTrafficPolicy Cluster" in p for p in hidden), hidden
    assert not problems_after(rendered, "gpu", balancer_trusted)


def test_custom_resources_are_checked_against_their_schemas(rendered: dict[str, Docs]) -> None:
    docs = copy.deepcopy(rendered["gpu"])
    find(docs, "ScaledObject", "tts-worker-gpu")["spec"]["minReplicas"] = 0  # KEDA's is minReplicaCount
    find(docs, "ScaledObject", "tts-worker-cpu")["spec"]["triggers"][0]["metadata"]["targetQueryValue"] = 4
    find(docs, "ServiceMonitor", "tts-web")["spec"]["endpoints"][0]["interval"] = "30 seconds"
    docs.append({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    report = validate.Report()
    validate.crd_validate(docs, "gpu", report)
    text = "\n".join(report.problems)
    assert "'minReplicas' was unexpected" in text
    assert "targetQueryValue: 4 is not of type 'string'" in text
    assert "/spec/endpoints/0/interval" in text
    assert "Widget/w: a custom resource with no schema" in text


def test_built_in_kinds_are_checked_strictly(k8s_tools: validate.Tools, rendered: dict[str, Docs]) -> None:
    docs = copy.deepcopy(rendered["local"])
    find(docs, "Deployment", "tts-web")["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    report = validate.Report()
    validate.kubernetes_validate(k8s_tools, docs, "local", report)
    assert any("'terminationGracePeriod' was unexpected" in p for p in report.problems), report.problems


def test_make_validate_k8s_runs_the_validators() -> None:
    makefile = (validate.ROOT / "Makefile").read_text()
    assert re.search(r"^validate-k8s:.*\n\tdeploy/k8s/validate\.sh", makefile, re.M)
    out = subprocess.run(
        [str(validate.K8S / "validate.sh"), "--no-checkov", "--overlay", "deploy/k8s/overlays/local"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=validate.ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "validate-k8s: passed, 0 problems" in out.stdout


def test_egress_to_the_data_services_and_mail_goes_to_their_addresses_only(rendered: dict[str, Docs]) -> None:
    def anywhere_5432(docs: Docs) -> None:  # as the base had it
        find(docs, "NetworkPolicy", "tts-data-clients")["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"] = (
            "0.0.0.0/0"
        )

    def smtp_anywhere(docs: Docs) -> None:  # as the base had it: ports, no destination
        del find(docs, "NetworkPolicy", "tts-web")["spec"]["egress"][0]["to"]

    def placeholder_kept(docs: Docs) -> None:
        find(docs, "NetworkPolicy", "tts-data-clients")["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"] = (
            "192.0.2.11/32"
        )

    cases: list[tuple[Callable[[Docs], None], str]] = [
        (anywhere_5432, "tts-data-clients: egress to PostgreSQL allows 0.0.0.0/0"),
        (smtp_anywhere, "tts-web: egress to SMTP may go to any address"),
        (placeholder_kept, "egress to Redis still names the placeholder 192.0.2.11/32"),
    ]
    for change, expected in cases:
        problems = problems_after(rendered, "gpu", change)
        assert any(expected in p for p in problems), (change.__name__, problems)
    # The local overlay runs PostgreSQL and Redis in the cluster: the placeholders there are unused.
    assert not any("placeholder" in p for p in validate.project_problems(rendered["local"], "local"))


def test_metrics_answer_a_narrow_block_and_never_through_the_edge(rendered: dict[str, Docs]) -> None:
    def wide(docs: Docs) -> None:  # as the base had it
        settings = next(
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tts-settings")
        )
        settings["data"]["TTS_METRICS_ALLOWED_IPS"] = "127.0.0.1,::1,10.0.0.0/8"

    def edge_open(docs: Docs) -> None:
        env = container(docs, "tts-edge", "edge")["env"]
        env[:] = [e for e in env if e["name"] != "TTS_METRICS_ALLOWED_IPS"]
        wide(docs)

    for overlay in ("gpu", "local"):  # as shipped: neither opens /metrics wide
        shipped = validate.project_problems(rendered[overlay], overlay)
        assert not any("TTS_METRICS_ALLOWED_IPS" in p or "answers /metrics" in p for p in shipped), shipped
    assert any("10.0.0.0/8 is wider than a /16" in p for p in problems_after(rendered, "gpu", wide))
    assert any(
        "the edge answers /metrics beyond its own pod" in p
        for p in problems_after(rendered, "gpu", edge_open)
    )


WAIT_FOR_SCHEMA = ["python", "manage.py", "wait_for_schema"]


def test_every_app_deployment_waits_for_the_schema(rendered: dict[str, Docs]) -> None:
    """Each Deployment that runs the app's code (web, the workers, beat, housekeeping, analysis,
    webhooks) waits in an initContainer until its code's migrations are applied; the edge runs none."""
    for overlay, docs in rendered.items():
        waiting = {
            validate.name_of(w)
            for w, pod in validate.pod_specs(docs)
            if any(c.get("command") == WAIT_FOR_SCHEMA for c in pod.get("initContainers", []))
        }
        app = {
            validate.name_of(w)
            for w, pod in validate.pod_specs(docs)
            if w["kind"] == "Deployment"
            and any(
                validate.image_repo(str(c.get("image", ""))) in validate.DJANGO_IMAGES
                for c in pod["containers"]
            )
        }
        assert len(app) >= (7 if overlay == "gpu" else 6) and waiting == app, (overlay, sorted(app ^ waiting))

    def no_wait(workload: str) -> Callable[[Docs], None]:
        def change(docs: Docs) -> None:
            pod = find(docs, "Deployment", workload)["spec"]["template"]["spec"]
            pod["initContainers"] = [c for c in pod["initContainers"] if c.get("command") != WAIT_FOR_SCHEMA]

        return change

    for workload in ("tts-worker-gpu", "tts-beat", "tts-web"):
        problems = problems_after(rendered, "gpu", no_wait(workload))
        expected = f"Deployment/{workload}: no initContainer runs `python manage.py wait_for_schema`"
        assert any(expected in p for p in problems), (workload, problems)
