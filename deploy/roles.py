"""The process roles: the one place the service's process topology is written.

Each :class:`Role` says what one kind of process is: the Celery queues it consumes, the command it
runs, the environment that makes it that role, its probes, how it stops, and under which name each
deployment form runs it. The local stack (deploy/stack.py, which `make run` and tests/stack.py use)
builds its processes from this table; the systemd units (deploy/systemd/), the Dockerfile's targets
(deploy/container/Dockerfile) and the Kubernetes manifests (deploy/k8s/) are written by hand and
checked against it: deploy/role_forms.py reads each form and says where it differs from the table
(tests/unit/test_process_roles.py; `make validate-k8s` on every rendered overlay too).
docs/decisions.md, "One table of process roles", says why they are checked rather than rendered.

Standard library only: the validators' venv and the edge image import deploy/ without Django.
The worker roles' queues are the rule settings take from webapp/env.py's ``worker_queues``
(a test holds the two together). /metrics is no role of its own: the web processes answer it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

# Placeholders in a role's command, filled per process.
QUEUES = "{queues}"  # the role's queues, comma-separated (a synthesis pool's: one per engine it serves)
NODE = "{node}"  # a synthesis worker's node name: its pool (synth, synth-gpu, an engine); the host follows
ENGINE = "{engine}"  # in a queue name: once per engine of TTS_WORKER_ENGINES
WORKER_ENGINES_DEFAULT = ("piper", "espeak")  # webapp/env.py WORKER_ENGINES_DEFAULT
WORKER_ROLE_DEFAULT = "synth"  # TTS_WORKER_ROLE when unset (webapp/settings.py)
# Seconds a warm-stopping worker may take after TTS_WORKER_STOP_GRACE: re-queue what was cut off, exit.
WORKER_STOP_MARGIN_SECONDS = 15
WORKER_STOP_GRACE_DEFAULT = 60  # TTS_WORKER_STOP_GRACE (webapp/settings.py)

# PostgreSQL and Redis: beside the roles, not in the table (no code of ours runs in them); the local
# stack starts them first (deploy/supervisor.py DATA_SERVICES), Kubernetes' dev component in the cluster.
DATA_SERVICES = ("postgres", "redis")

ProbeWhen = Literal["startup", "liveness", "readiness"]


class CheckoutPath(str):
    """An argument that is a file of the checkout, named relative to its root: each form has the
    checkout somewhere else (/opt/tts, /app, the working tree), so only the end of the path must match."""

    __slots__ = ()


@dataclass(frozen=True)
class Probe:
    """A check on the process, as Kubernetes asks it: ``exec: <argv>``, ``http: <path>`` or ``tcp: <port name>``."""

    when: ProbeWhen
    check: str


@dataclass(frozen=True)
class Role:
    name: str
    what: str
    # TTS_PROCESS_NAME: the logs' name and the process's limits (webapp/env.py process_kind); a
    # synthesis pool's may add ``-<pool>`` (worker-cpu, worker-piper).
    process_name: str
    # argv with QUEUES and NODE to fill; the program is looked up on PATH (the venv's bin in a form).
    command: tuple[str, ...]
    # Options a form adds for its place and that never change what the process is: sockets, the
    # schedule file, the user, a child count set in settings. Each takes one value.
    placed: frozenset[str] = frozenset()
    queues: tuple[str, ...] = ()
    # What makes the process this role (beside TTS_PROCESS_NAME); a synthesis pool adds its engines.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    probes: tuple[Probe, ...] = ()
    # A Celery worker: stopped warm through its parent only, given the grace period and a margin.
    warm_stop: bool = False
    # "" when the local stack cannot serve without it; else what is missing while it is held back.
    missing_means: str = ""
    # Its name under each form; None or () where the form has none.
    stack_service: str | None = None
    systemd_unit: str | None = None
    # The images (Dockerfile targets) it runs from; the first is the default one.
    images: tuple[str, ...] = ()
    # The Dockerfile targets whose command is this role's.
    image_commands: tuple[str, ...] = ()
    # In the images, the launcher that stands for ``command`` (the edge renders Nginx's config first).
    image_launcher: tuple[str, ...] = ()
    # Its Deployments' app.kubernetes.io/component labels (a synthesis pool per overlay).
    k8s_components: tuple[str, ...] = ()
    django: bool = True  # reads the settings (gets their environment and TTS_PROCESS_NAME)

    @property
    def worker(self) -> bool:
        return "TTS_WORKER_ROLE" in self.env

    def queues_for(self, engines: Sequence[str]) -> tuple[str, ...]:
        """The queues a process of this role consumes, serving ``engines`` (a synthesis pool)."""
        out: list[str] = []
        for queue in self.queues:
            out += [queue.replace(ENGINE, e) for e in engines] if ENGINE in queue else [queue]
        return tuple(out)

    def argv(
        self, engines: Sequence[str] = WORKER_ENGINES_DEFAULT, node: str = "", root: Path | None = None
    ) -> list[str]:
        """The command with its queues and node name filled in, a checkout's file under ``root``."""
        queues = ",".join(self.queues_for(engines))
        out = []
        for arg in self.command:
            if isinstance(arg, CheckoutPath):
                out.append(str(root / arg) if root is not None else str(arg))
            else:
                out.append(arg.replace(QUEUES, queues).replace(NODE, node or self.name))
        return out


def _celery_worker(node: str) -> tuple[str, ...]:
    return (
        "celery", "-A", "webapp", "worker", "--loglevel", "INFO", "--pool", "prefork",
        "-Q", QUEUES, "-n", f"{node}@%h", "--without-mingle", "--without-gossip",
    )  # fmt: skip


_WORKER_PLACED = frozenset({"--concurrency"})  # children: TTS_*_CONCURRENCY in settings; tests pass one
_PROBE_CMD = "exec: python -m webapp.speech.runtime.probe"

ROLES: tuple[Role, ...] = (
    Role(
        name="web",
        what="gunicorn (uvicorn workers, ASGI): the site, the API, /healthz and /metrics",
        process_name="gunicorn",
        command=("gunicorn", "--config", CheckoutPath("deploy/gunicorn.conf.py")),
        placed=frozenset({"--bind", "--control-socket", "--chdir", "--user", "--group", "--workers"}),
        probes=(Probe("readiness", "http: /healthz/ready"), Probe("liveness", "http: /healthz/live")),
        stack_service="gunicorn",
        systemd_unit="tts-web.service",
        images=("web",),
        image_commands=("web",),
        k8s_components=("web",),
    ),
    Role(
        name="synth",
        what="a synthesis pool: loads its engines' models, one queue per engine",
        process_name="worker",
        command=_celery_worker(NODE),
        placed=_WORKER_PLACED,
        queues=(f"synth.{ENGINE}",),
        env=MappingProxyType({"TTS_WORKER_ROLE": "synth"}),
        probes=(
            Probe("startup", f"{_PROBE_CMD} live"),
            Probe("liveness", f"{_PROBE_CMD} live"),
            Probe("readiness", f"{_PROBE_CMD} ready"),
        ),
        warm_stop=True,
        stack_service="worker",
        systemd_unit="tts-worker@.service",
        images=("worker", "worker-gpu"),
        image_commands=("worker", "worker-gpu"),
        k8s_components=("worker-cpu", "worker-gpu", "worker-voxcpm", "worker-remote"),
    ),
    Role(
        name="housekeeping",
        what="cleanup, re-dispatch, the lease reaper (beat schedules them); no model",
        process_name="housekeeping",
        command=_celery_worker("housekeeping"),
        placed=_WORKER_PLACED,
        queues=("default", "housekeeping"),
        env=MappingProxyType({"TTS_WORKER_ROLE": "housekeeping"}),
        warm_stop=True,
        missing_means="no stuck job is reaped or re-sent and no old file is removed",
        stack_service="housekeeping",
        systemd_unit="tts-housekeeping.service",
        images=("worker",),
        k8s_components=("housekeeping",),
    ),
    Role(
        name="analysis",
        what="voice-prompt analysis: the speaker encoder on CPU torch",
        process_name="analysis",
        command=_celery_worker("analysis"),
        placed=_WORKER_PLACED,
        queues=("analysis",),
        env=MappingProxyType({"TTS_WORKER_ROLE": "analysis"}),
        warm_stop=True,
        missing_means="uploaded voices stay processing",
        stack_service="analysis",
        systemd_unit="tts-analysis.service",
        images=("analysis",),
        image_commands=("analysis",),
        k8s_components=("analysis",),
    ),
    Role(
        name="webhooks",
        what="the webhook outbox: signs and posts; a slow receiver never holds a synthesis worker",
        process_name="webhooks",
        command=_celery_worker("webhooks"),
        placed=_WORKER_PLACED,
        queues=("webhooks",),
        env=MappingProxyType({"TTS_WORKER_ROLE": "webhooks"}),
        warm_stop=True,
        missing_means="no webhook is sent (they wait in the outbox)",
        stack_service="webhooks",
        systemd_unit="tts-webhooks.service",
        images=("worker",),
        k8s_components=("webhooks",),
    ),
    Role(
        name="beat",
        what="Celery beat: sends the schedule while it holds the beat lease in Redis",
        process_name="beat",
        # No pid file: after a crash a stale one would keep the restarted beat from starting.
        command=("celery", "-A", "webapp", "beat", "--loglevel", "INFO", "--pidfile", ""),
        placed=frozenset({"--schedule"}),
        missing_means="no housekeeping is scheduled",
        stack_service="beat",
        systemd_unit="tts-beat.service",
        images=("web",),
        k8s_components=("beat",),
    ),
    Role(
        name="edge",
        what="Nginx: TLS, per-address limits, static files, audio after Django's check",
        process_name="edge",
        # The config is rendered by deploy/nginx.py (its path placed by each form).
        command=("nginx", "-g", "daemon off;"),
        placed=frozenset({"-c", "-p", "-e"}),
        probes=(Probe("readiness", "tcp: https"), Probe("liveness", "tcp: https")),
        stack_service="nginx",
        images=("edge",),
        image_commands=("edge",),
        image_launcher=("python3", CheckoutPath("deploy/container/edge.py")),
        k8s_components=("edge",),
        django=False,  # systemd: the distribution's nginx.service, configured by hand (docs/nginx.md)
    ),
)

BY_NAME: Mapping[str, Role] = MappingProxyType({role.name: role for role in ROLES})


def role(name: str) -> Role:
    return BY_NAME[name]


def stop_timeout_floor(grace: int = WORKER_STOP_GRACE_DEFAULT) -> int:
    """The fewest seconds a form may give a warm-stopping worker before it kills it."""
    return grace + WORKER_STOP_MARGIN_SECONDS
