"""The images and the rendered `local` overlay, run with podman: a real job through the web container.

`make test-containers` builds the images first (tests/containers/prepare.sh). Then this test:

1. starts PostgreSQL and Redis on this machine's loopback, on spare ports, with the project's own
   provisioning (deploy/stack.py, as `make run` does): the overlay's dev component runs the
   official postgres and redis images, which no registry here serves, and an image of ours
   imitating their entry points would test the imitation, not the manifests;
2. renders ``deploy/k8s/overlays/local`` with kubectl and changes it for podman only
   (tests/containers/kube.py says what and why), with two worker replicas;
3. runs the migrations and creates the demo tenant's API key as one-off containers of the web
   image, then `podman kube play`s the rest;
4. submits a job through the edge container (TLS, Nginx) to the web container, gets its audio
   from the worker through the edge's X-Accel-Redirect location on the shared media volume;
5. kills the worker container running a second job with SIGKILL mid-synthesis and sees that job
   finish on the other replica (or the restarted container), audio included;
6. tears everything down, also when a step failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import redis
import requests

from deploy import stack as deploy_stack
from deploy.stack import StackConfig, Supervisor
from tests.containers import kube
from tests.stack import spare_port

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var" / "containers"
APP_UID = 10001  # the images' user (deploy/container/Dockerfile)
ESPEAK = "espeak-en-us"
PIPER = "en_US-joe-medium"
# Long enough that the job is still synthesising when its worker is killed (one sentence a part).
LONG = " ".join(
    f"Sentence number {i} of the long job, which keeps a worker busy for a while before it is done."
    for i in range(1, 31)
)
# Quicker recovery than production's defaults: a dead worker's lease runs out in 10 s and the
# reaper looks every 5 s (docs/workers.md). Fewer processes on these 2 shared cores.
SETTINGS = {
    "TTS_JOB_LEASE_SECONDS": "10",
    "TTS_HOUSEKEEPING_EVERY_REAP_STUCK_JOBS": "5",
    "TTS_HOUSEKEEPING_EVERY_REDISPATCH_JOBS": "5",
    "TTS_WORKER_CONCURRENCY": "1",
    "TTS_HOUSEKEEPING_CONCURRENCY": "1",
    "TTS_GUNICORN_WORKERS": "1",
    "TTS_FAST_PASSWORD_HASHER": "1",
}


def podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])} ... exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done


def wait_until(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)


def containers_conf(path: Path) -> Path:
    """podman's settings for this test: the rlimits a container may have here.

    podman 4.3 gives a rootful container RLIMIT_NOFILE 1048576 and RLIMIT_NPROC up to pid_max,
    and runc's prlimit fails with EPERM where this process may not raise its hard limits (no
    CAP_SYS_RESOURCE, as in this sandbox): every container start fails ("error setting rlimit
    type 7"). The limits this process has are always allowed.
    """
    import resource

    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    path.write_text(
        f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
    )
    return path


def write_owned(path: Path, text: str) -> None:
    """A file only the images' user reads (the container sees the folder through a hostPath)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o400)
    if os.geteuid() == 0:
        os.chown(path, APP_UID, APP_UID)
        os.chown(path.parent, APP_UID, APP_UID)


@pytest.fixture(scope="module")
def podman_env() -> Iterator[None]:
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: run `make test-containers` (tests/containers/prepare.sh installs it)")
    VAR.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("CONTAINERS_CONF")
    os.environ["CONTAINERS_CONF"] = str(containers_conf(VAR / "containers.conf"))
    yield
    if old is None:
        os.environ.pop("CONTAINERS_CONF", None)
    else:
        os.environ["CONTAINERS_CONF"] = old


@pytest.fixture(scope="module")
def data_services(podman_env: None) -> Iterator[StackConfig]:
    folder = VAR / "stack"
    shutil.rmtree(folder, ignore_errors=True)
    cfg = StackConfig(
        var_dir=folder,
        pg_port=spare_port(),
        redis_port=spare_port(),
        http_port=spare_port(),
        https_port=spare_port(),
        name="containers",
    )
    sup = Supervisor(cfg, echo=False)
    try:
        deploy_stack.prepare_var(cfg)
        deploy_stack.start_data_services(sup, cfg)
        yield cfg
    finally:
        sup.stop_all()


class Deployment:
    """The overlay, played: its pods and the edge's address."""

    def __init__(self, cfg: StackConfig, play: Path, https_port: int, key: str) -> None:
        self.cfg = cfg
        self.play = play
        self.https_port = https_port
        self.session = requests.Session()
        self.session.trust_env = False  # the machine's proxy and CA variables are not ours
        # The edge's certificate, made for this run (CN localhost, SAN 127.0.0.1): TLS is checked too.
        self.session.verify = str(VAR / "secrets" / "tts-tls" / "tls.crt")
        self.session.headers["Authorization"] = f"Bearer {key}"

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.https_port}{path}"

    def job_row(self, job_id: str) -> dict[str, Any]:
        with psycopg.connect(self.cfg.database_url.replace("postgres://", "postgresql://")) as conn:
            row = conn.execute(
                "SELECT status, stage, worker, attempts FROM speech_synthesisjob WHERE id = %s", (job_id,)
            ).fetchone()
        assert row is not None, job_id
        return dict(zip(("status", "stage", "worker", "attempts"), row, strict=True))

    def serving_hosts(self, engine: str) -> dict[str, str]:
        """Each worker child's host -> its state, of the children whose heartbeat names ``engine``."""
        client = redis.Redis.from_url(self.cfg.redis_url, decode_responses=True)
        try:
            ids = sorted(cast(set[str], client.smembers("tts:heartbeats")))
            raws = cast(list[str | None], client.mget([f"tts:heartbeat:{i}" for i in ids])) if ids else []
            beats = [json.loads(raw) for raw in raws if raw]
        finally:
            client.close()
        return {str(b.get("host")): str(b.get("state")) for b in beats if engine in (b.get("engines") or [])}

    def wait_for_voice(self, voice: str, timeout: float = 180) -> None:
        """The workers add the built-in voices to the catalogue as they start (after their models load)."""

        def listed() -> bool:
            with contextlib.suppress(requests.RequestException):
                response = self.session.get(self.url("/api/v1/voices?limit=100"), timeout=10)
                return response.status_code == 200 and voice in response.text
            return False

        wait_until(f"voice {voice} listed", listed, timeout, every=2)

    def submit(self, text: str, voice: str, timeout: float = 240) -> str:
        """POST a job; a 503 (no worker yet: the pods are still loading their models) is retried."""
        body = {"text": text, "voice": voice, "format": "wav"}
        idem = str(uuid.uuid4())
        last = ""

        def accepted() -> str | None:
            nonlocal last
            try:
                response = self.session.post(
                    self.url("/api/v1/speech"), json=body, headers={"Idempotency-Key": idem}, timeout=30
                )
            except requests.RequestException as exc:
                last = repr(exc)
                return None
            last = f"{response.status_code} {response.text[:300]}"
            if response.status_code in (200, 201, 202):
                return str(response.json()["id"])
            assert response.status_code in (429, 502, 503, 504), last
            return None

        try:
            return str(wait_until("the job accepted", accepted, timeout, every=2))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last answer: {last}") from None

    def finished(self, job_id: str, timeout: float) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            response = self.session.get(self.url(f"/api/v1/speech/{job_id}?wait=10"), timeout=30)
            assert response.status_code == 200, response.text[:300]
            job: dict[str, Any] = response.json()
            return job if job["status"] not in ("queued", "running") else None

        job: dict[str, Any] = wait_until(f"job {job_id} finished", done, timeout, every=0)
        return job

    def audio(self, job: dict[str, Any]) -> bytes:
        assert job["status"] == "succeeded", job
        url = job["audio_url"]
        response = self.session.get(url if url.startswith("http") else self.url(url), timeout=60)
        assert response.status_code == 200, (response.status_code, response.text[:300])
        return response.content


def _render_local_overlay() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is missing: it renders the overlay (kubectl kustomize)")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / "local")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return kube.load(rendered)


def _secrets(cfg: StackConfig) -> dict[str, dict[str, str]]:
    return {
        "tts-secrets": {
            "DATABASE_URL": cfg.database_url,
            "REDIS_URL": cfg.redis_url,
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
            "TTS_API_KEY_SECRET": secrets.token_urlsafe(50),
        }
    }


def _secret_dirs(values: dict[str, dict[str, str]]) -> dict[str, str]:
    """The Secret volumes' files: the app's secrets and the edge's certificate (self-signed)."""
    base = VAR / "secrets"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    base.chmod(0o700)
    for key in ("DJANGO_SECRET_KEY", "TTS_API_KEY_SECRET"):
        write_owned(base / "tts-secrets" / key, values["tts-secrets"][key])
    tls = base / "tts-tls"
    tls.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
        + ["-keyout", str(tls / "tls.key"), "-out", str(tls / "tls.crt")],
        check=True,
        capture_output=True,
    )
    for name in ("tls.key", "tls.crt"):
        write_owned(tls / name, (tls / name).read_text())
    return {"tts-secrets": str(base / "tts-secrets"), "tts-tls": str(tls)}


def _one_off(image: str, env_file: Path, *command: str) -> str:
    """A container of ``image`` on the host's network, removed after; its output."""
    done = podman(
        "run", "--rm", "--network", "host", "--read-only", "--tmpfs", "/tmp", "--env-file", str(env_file),
        "-v", f"{VAR / 'oneoff-var'}:/var/lib/tts", image, *command,
        timeout=600,
    )  # fmt: skip
    return done.stdout


def _images(docs: list[dict[str, Any]]) -> set[str]:
    return {
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def _worker_containers() -> dict[str, str]:
    """Host name -> container name of every synthesis worker container (running or not)."""
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    out = {}
    for name in names:
        if name.startswith("tts-worker-cpu-pod-") and not name.endswith("-infra"):
            hostname = podman("inspect", "--format", "{{.Config.Hostname}}", name).stdout.strip()
            out[hostname] = name
    return out


def _remove_pods(played: list[dict[str, Any]]) -> None:
    """Every pod `kube play` made of these Deployments, also those a failed play left behind."""
    prefixes = tuple(f"{d['metadata']['name']}-pod-" for d in played if d["kind"] == "Deployment")
    pods = [
        p
        for p in podman("pod", "ps", "--format", "{{.Name}}", check=False).stdout.split()
        if p.startswith(prefixes)
    ]
    if pods:
        podman("pod", "rm", "-f", "-t", "5", *pods, timeout=300, check=False)
    podman("volume", "rm", "-f", "tts-media", check=False)


@pytest.fixture(scope="module")
def deployment(data_services: StackConfig) -> Iterator[Deployment]:
    cfg = data_services
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    docs = _render_local_overlay()
    values = _secrets(cfg)
    web_port, http_port, https_port = spare_port(), spare_port(), spare_port()
    plan = kube.PodmanPlan(
        secrets=values,
        secret_dirs=_secret_dirs(values),
        web_port=web_port,
        http_port=http_port,
        https_port=https_port,
        settings=SETTINGS,
        replicas={"tts-worker-cpu": 2},
    )
    played = kube.for_podman(docs, plan)
    play = VAR / "play.yaml"
    play.write_text(kube.dump(played))
    play.chmod(0o600)  # it holds the secrets' values
    for image in sorted(_images(played)):
        if podman("image", "exists", image, check=False).returncode != 0:
            pytest.fail(
                f"image {image} is missing: `make test-containers` builds it (tests/containers/prepare.sh)"
            )
    (settings,) = [
        d for d in played if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tts-settings")
    ]
    env_file = VAR / "oneoff.env"
    env_file.write_text(
        "".join(f"{k}={v}\n" for k, v in {**settings["data"], **values["tts-secrets"]}.items())
    )
    env_file.chmod(0o600)
    oneoff_var = VAR / "oneoff-var"
    shutil.rmtree(oneoff_var, ignore_errors=True)
    oneoff_var.mkdir()
    if os.geteuid() == 0:
        os.chown(oneoff_var, APP_UID, APP_UID)
    (web_image,) = {
        c["image"]
        for d in played
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "tts-web"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    _remove_pods(played)  # what an interrupted run left
    try:
        t = time.monotonic()
        _one_off(web_image, env_file, "python", "manage.py", "migrate", "--noinput", "-v", "0")
        out = _one_off(web_image, env_file, "python", "manage.py", "bootstrap_demo")
        match = re.search(r"API key\s+(\S+)", out)
        assert match, out
        timings["migrate + tenant (one-off containers)"] = time.monotonic() - t
        t = time.monotonic()
        podman("kube", "play", str(play), timeout=600)
        dep = Deployment(cfg, play, https_port, match.group(1))

        def ready() -> bool:
            with contextlib.suppress(requests.RequestException):
                response = dep.session.get(dep.url("/healthz/ready"), timeout=5)
                if response.status_code == 404:  # a web image from before the readiness split
                    response = dep.session.get(dep.url("/healthz"), timeout=5)
                return response.status_code == 200
            return False

        wait_until("the web pod ready through the edge", ready, 240)
        timings["kube play until the web answers through the edge"] = time.monotonic() - t
        yield dep
    finally:
        logs = VAR / "logs"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        for name in podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split():
            if name.startswith("tts-"):
                done = podman("logs", name, check=False)
                (logs / f"{name}.log").write_text(done.stdout + done.stderr)
        podman("kube", "down", str(play), timeout=300, check=False)
        _remove_pods(played)
        timings["whole run"] = time.monotonic() - t0
        (VAR / "run-timings.json").write_text(json.dumps(timings, indent=1))
        print("\n" + "\n".join(f"timing: {k} {v:.0f}s" for k, v in timings.items()))


def mid_job(row: dict[str, Any]) -> bool:
    """Past its first sentence and short of its middle: a kill now interrupts real work. (A sentence
    takes a fifth of a second or less: waiting for one exact stage missed it.)"""
    stage = re.fullmatch(r"synthesising (\d+)/(\d+)", row["stage"] or "")
    return stage is not None and 2 <= int(stage[1]) <= int(stage[2]) // 2


def test_a_job_through_the_web_container_and_a_killed_worker(deployment: Deployment) -> None:
    dep = deployment
    # 1. A real job: submitted through the edge and the web container, synthesised by a worker
    #    container, its audio read through the edge from the shared media volume.
    t = time.monotonic()
    dep.wait_for_voice(ESPEAK)
    dep.wait_for_voice(PIPER)
    print(f"\nthe workers' voices listed {time.monotonic() - t:.1f}s after the web answered")
    # Either replica may take the long job: both must be serving Piper, not one still loading it
    # (a listed voice says only that one of them loaded it).
    wait_until(
        "both worker replicas ready for Piper",
        lambda: list(dep.serving_hosts("piper").values()).count("ready") >= 2,
        180,
    )
    print(f"both replicas ready {time.monotonic() - t:.1f}s after the web answered")
    t = time.monotonic()
    first = dep.finished(dep.submit("Hello from the containers.", ESPEAK), timeout=120)
    audio = dep.audio(first)
    assert audio[:4] == b"RIFF" and len(audio) > 10_000, audio[:16]
    print(f"first job: {time.monotonic() - t:.1f}s from submit to audio")

    # 2. The worker container running a long job dies (SIGKILL: parent and children at once, as
    #    when a node fails); the job finishes on the other replica or the restarted container.
    job_id = dep.submit(LONG, PIPER)
    try:
        row = wait_until(
            "the long job mid-synthesis",
            lambda: mid_job(r := dep.job_row(job_id)) and r,
            120,
            every=0.2,
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; the job: {dep.job_row(job_id)}; workers: {dep.serving_hosts('piper')}"
        ) from exc
    host = row["worker"].split(":", 1)[0]
    workers = _worker_containers()
    assert len(workers) == 2, workers  # two replicas, each its own host name
    victim = workers[host]
    podman("kill", "--signal", "KILL", victim)
    killed = time.monotonic()
    job = dep.finished(job_id, timeout=240)
    recovered = time.monotonic() - killed
    final = dep.job_row(job_id)
    assert job["status"] == "succeeded", job
    assert final["attempts"] >= 2, final
    assert final["worker"] != row["worker"], final
    audio = dep.audio(job)
    assert audio[:4] == b"RIFF" and len(audio) > 100_000, len(audio)
    print(
        f"killed {victim} mid-job; the job finished {recovered:.1f}s later on {final['worker'].split(':', 1)[0]}"
    )
