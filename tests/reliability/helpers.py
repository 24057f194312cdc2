"""Helpers for tests that drive real worker processes: tenants, jobs, waiting, killing.

Jobs are created through ``speech.lifecycle.submit_job`` (the same path as the
API), so each one has its reservation and its message on the engine queue.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from typing import Any, TypedDict

import psutil

from deploy.stack import Service
from tests.stack import CFG, TestStack

ESPEAK = "espeak-en-us"
PIPER = "en_US-joe-medium"

SHORT = "Hello there. This is a short job."
# About 40 s of Piper audio in 10 sentences: caught mid-job easily, about 2 s to synthesise on 2 idle cores.
LONG = " ".join(
    f"Sentence number {i} is here to keep the worker busy for a little while." for i in range(1, 11)
)


class WorkerEnv(TypedDict, total=False):
    """Settings passed to :func:`start_worker` as a prepared dict (``**env``): environment strings.

    Named, so that unpacking one cannot be taken for ``concurrency`` or ``wait_ready``.
    """

    CELERY_DB_REUSE_MAX: str
    TTS_JOB_LEASE_SECONDS: str
    TTS_WORKER_MAX_AGE_SECONDS: str
    TTS_WORKER_MAX_MEMORY_KB: str
    TTS_WORKER_MAX_RSS_MB: str
    TTS_WORKER_MAX_TASKS_PER_CHILD: str
    TTS_WORKER_RTF_DRIFT_FACTOR: str


def make_org(name: str = "acme", **plan_fields: Any) -> Any:
    from webapp.tenants.models import Plan
    from webapp.tenants.services import create_organization

    defaults: dict[str, Any] = {
        "name": f"plan-{name}",
        "monthly_characters": 10_000_000,
        "max_characters_per_request": 100_000,
        "max_concurrent_jobs": 1000,
    }
    defaults.update(plan_fields)
    plan, _ = Plan.objects.get_or_create(slug=f"plan-{name}", defaults=defaults)
    return create_organization(name, plan=plan)


def submit(
    org: Any, text: str, voice: str = ESPEAK, fmt: str = "wav", lane: str = "batch", **params: Any
) -> Any:
    from webapp.speech import lifecycle
    from webapp.speech.models import Voice

    v = Voice.objects.get(voice_id=voice)
    # Uncached (sentence cache): these tests time the worker with one long text in several jobs.
    request = lifecycle.JobRequest(
        text=text,
        voice=v,
        format=fmt,
        sample_rate=None,
        params=params,
        billable_chars=len(text),
        use_cache=False,
        lane=lane,
    )
    job, created = lifecycle.submit_job(org, request)
    assert created
    return job


def job(job_id: Any) -> Any:
    from webapp.speech.models import SynthesisJob

    return SynthesisJob.objects.get(id=job_id)


def wait_status(
    job_ids: Iterable[Any], statuses: Iterable[str] = ("succeeded", "failed", "canceled"), timeout: float = 60
) -> list[Any]:
    from webapp.speech.models import SynthesisJob

    ids = [str(j) for j in job_ids]
    wanted = set(statuses)
    deadline = time.monotonic() + timeout
    while True:
        rows = list(SynthesisJob.objects.filter(id__in=ids))
        if len(rows) == len(ids) and all(r.status in wanted for r in rows):
            order = {i: n for n, i in enumerate(ids)}
            return sorted(rows, key=lambda r: order[str(r.id)])
        if time.monotonic() > deadline:
            states = {str(r.id)[:8]: (r.status, r.stage, r.attempts) for r in rows}
            raise AssertionError(f"jobs not {sorted(wanted)} after {timeout}s: {states}")
        time.sleep(0.1)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pause_while_running(job_id: Any, seconds: float, slice_seconds: float = 1.5) -> float:
    """A busy host: the job's worker child gets no CPU for ``seconds`` of its run, in slices
    (SIGSTOP/SIGCONT) shorter than the heartbeat TTL, advancing a little in between. Returns
    the seconds it was paused (less when the job ended first)."""
    row = wait_until(lambda: (r := job(job_id)).status == "running" and r, 60, "the job to start")
    pid = int(row.worker.rpartition(":")[2])
    paused = 0.0
    while paused < seconds and job(job_id).status == "running":
        os.kill(pid, signal.SIGSTOP)
        time.sleep(slice_seconds)
        os.kill(pid, signal.SIGCONT)
        paused += slice_seconds
        time.sleep(0.2)
    return paused


def usage_events(job_id: Any) -> list[str]:
    from webapp.speech.models import UsageEvent

    return sorted(UsageEvent.objects.filter(job_key=job_id).values_list("kind", flat=True))


def children(service: Service) -> list[psutil.Process]:
    assert service.process is not None
    try:
        return psutil.Process(service.process.pid).children(recursive=False)
    except psutil.NoSuchProcess:
        return []


def kill_group(service: Service) -> None:
    """kill -9 the worker parent and all its children, as when a node dies."""
    assert service.process is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(service.process.pid, signal.SIGKILL)
    service.process.wait(10)


def start_worker(
    stack: TestStack,
    name: str,
    engines: str = "espeak",
    concurrency: int = 1,
    wait_ready: bool = True,
    **env: str,
) -> Service:
    queues = ",".join(f"synth.{e}" for e in engines.split(","))
    base = {
        # tests.settings re-applies the stack's URLs and paths over the environment;
        # these workers take everything from the environment, so overrides stick.
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "TTS_WORKER_ENGINES": engines,
        "TTS_HEARTBEAT_INTERVAL": "0.5",
        "TTS_HEARTBEAT_TTL": "3",
    }
    base.update(env)
    return stack.start_worker(
        name, queues=queues, concurrency=str(concurrency), env=base, wait_ready=wait_ready
    )


def media_root() -> str:
    return str(CFG.path("media"))


def partial_files(root: str) -> list[str]:
    found: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        found.extend(os.path.join(dirpath, f) for f in files if f.startswith(".") or f.endswith(".part"))
    return found


def flush_queues(stack: TestStack, *queues: str) -> None:
    """Drop leftover messages of earlier tests, so a fresh worker sees only this test's jobs."""
    r = stack.redis_client()
    for q in queues:
        r.delete(q)
