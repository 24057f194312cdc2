"""Worker benchmark: children x threads on this machine, memory over a long run, recycle cost.

Runs real Celery workers against the test stack (PostgreSQL + Redis under
``TTS_TEST_VAR_DIR``, started here unless already running) and real jobs:

1. Piper throughput (audio seconds per wall second) with one child of 2
   inference threads against 2 children of 1 thread each, same jobs.
2. Worker RSS (parent + children) after 20, 100 and 500 short eSpeak jobs with
   recycling on (max 50 tasks per child) and off; with recycling on it must
   stay within 10% of the 20-job figure.
3. Recycle cost: seconds from a child's exit to the next child ready.

``quick=True`` scales every workload down (a smoke run).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

JOB_TEXT = "Hello there. This is a short job for the benchmark."
PIPER_TEXT = " ".join(
    f"Paragraph {i} of the benchmark reads a few ordinary sentences aloud, at an ordinary pace."
    for i in range(4)
)


def _setup() -> tuple[Any, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from deploy import stack as deploy_stack
    from tests.stack import CFG, TestStack

    stack = TestStack()
    owned = not deploy_stack.port_in_use(CFG.redis_port)
    if owned:
        stack.start_data()
    call_command("migrate", "--noinput", verbosity=0)
    return stack, owned


def _voices() -> None:
    from synth.registry import list_voices
    from webapp.speech.services import sync_builtin_voices

    sync_builtin_voices(
        {
            "id": v.id,
            "name": v.name,
            "engine": v.engine,
            "language": v.language,
            "sample_rate": v.sample_rate,
            "capabilities": v.capabilities,
        }
        for v in list_voices()
    )


def _worker_rss_mb(service: Any) -> float:
    import psutil

    root = psutil.Process(service.process.pid)
    procs = [root, *root.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def _run_jobs(org: Any, n: int, text: str, voice: str) -> tuple[list[Any], float]:
    from tests.reliability.helpers import submit, wait_status

    started = time.monotonic()
    ids = [submit(org, f"{i}. {text}", voice=voice).id for i in range(n)]
    rows = wait_status(ids, timeout=60 + n * 2)
    return rows, time.monotonic() - started


def _throughput(stack: Any, org: Any, concurrency: int, threads: int, jobs: int) -> tuple[float, float]:
    from tests.reliability.helpers import PIPER, flush_queues, start_worker

    flush_queues(stack, "synth.piper")
    worker = start_worker(
        stack,
        f"bench-c{concurrency}t{threads}",
        engines="piper",
        concurrency=concurrency,
        TTS_WORKER_THREADS=str(threads),
    )
    try:
        _run_jobs(org, concurrency, "Warm up.", PIPER)
        rows, wall = _run_jobs(org, jobs, PIPER_TEXT, PIPER)
        audio = sum(r.duration_seconds or 0 for r in rows)
        assert all(r.status == "succeeded" for r in rows)
        return audio / wall, wall
    finally:
        stack.stop_service(worker)


def _memory(stack: Any, org: Any, marks: list[int], recycle: bool) -> tuple[list[float], list[float]]:
    from tests.reliability.helpers import ESPEAK, flush_queues, start_worker
    from webapp.speech import recycling

    flush_queues(stack, "synth.espeak")
    env = (
        {"TTS_WORKER_MAX_TASKS_PER_CHILD": "50"}
        if recycle
        else {
            "TTS_WORKER_MAX_TASKS_PER_CHILD": "1000000",
            "TTS_WORKER_MAX_MEMORY_KB": str(2**40),
            "TTS_WORKER_MAX_RSS_MB": "0",
            "TTS_WORKER_MAX_AGE_SECONDS": "0",
            "TTS_WORKER_RTF_DRIFT_FACTOR": "0",
        }
    )
    worker = start_worker(stack, f"bench-mem-{'on' if recycle else 'off'}", **env)
    try:
        rss: list[float] = []
        done = 0
        node = ""
        for mark in marks:
            rows, _ = _run_jobs(org, mark - done, JOB_TEXT, ESPEAK)
            node = rows[0].metrics["node"]
            done = mark
            time.sleep(1.5)  # let a recycle that just happened finish loading
            rss.append(_worker_rss_mb(worker))
        events = recycling.node_events(stack.redis_client(), node)
        exits = [e["at"] for e in events if e["event"] == "exit"]
        readies = [e["at"] for e in events if e["event"] == "ready"]
        costs = [min(r for r in readies if r >= x) - x for x in exits if any(r >= x for r in readies)]
        return rss, costs
    finally:
        stack.stop_service(worker)


def run(quick: bool) -> list[str]:
    stack, owned = _setup()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    from tests.reliability.helpers import make_org
    from webapp.speech.models import SynthesisJob
    from webapp.tenants.models import Organization

    try:
        _voices()
        org = make_org(f"bench-{int(time.time())}")
        jobs = 4 if quick else 12
        a_rate, a_wall = _throughput(stack, org, concurrency=1, threads=2, jobs=jobs)
        b_rate, b_wall = _throughput(stack, org, concurrency=2, threads=1, jobs=jobs)
        say(
            f"piper, {jobs} jobs of {len(PIPER_TEXT)} chars: 1 child x 2 threads {a_rate:.1f} audio s/s ({a_wall:.1f} s); "
            f"2 children x 1 thread {b_rate:.1f} audio s/s ({b_wall:.1f} s); ratio {b_rate / a_rate:.2f}"
        )
        marks = [10, 30, 60] if quick else [20, 100, 500]
        for recycle in (True, False):
            rss, costs = _memory(stack, org, marks, recycle)
            figures = ", ".join(f"{m} jobs {r:.0f} MiB" for m, r in zip(marks, rss, strict=True))
            drift = (max(rss) - rss[0]) / rss[0] * 100
            verdict = ("within 10%" if drift <= 10 else "OVER 10%") if recycle else "no limit applies"
            say(
                f"worker RSS (parent + child), eSpeak, recycling {'on (50 tasks/child)' if recycle else 'off'}: "
                f"{figures}; max {drift:+.1f}% vs first ({verdict})"
            )
            if recycle and costs:
                say(
                    f"recycle cost (child exit -> next child ready), eSpeak worker: mean {statistics.mean(costs):.2f} s, "
                    f"max {max(costs):.2f} s over {len(costs)} recycles"
                )
        SynthesisJob.objects.filter(organization=org).delete()
        Organization.objects.filter(pk=org.pk).delete()
    finally:
        if owned:
            stack.stop_all()
    return lines


if __name__ == "__main__":
    import sys

    run(quick="--quick" in sys.argv)
