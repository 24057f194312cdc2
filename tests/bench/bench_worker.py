"""Worker benchmark: children x threads on this machine, memory over a long run, recycle cost.

Runs real Celery workers against the test stack (PostgreSQL + Redis under
``TTS_TEST_VAR_DIR``, started here unless already running) and real jobs:

1. Piper throughput (audio seconds per wall second) with one child of 2
   inference threads against 2 children of 1 thread each, same jobs.
2. Worker RSS (parent + children) after 20, 100 and 500 short eSpeak jobs with
   recycling on (max 50 tasks per child) and off; with recycling on it must
   stay within 10% of the 20-job figure.
3. Recycle cost: seconds from a child's exit to the next child ready.
4. ETA accuracy: ``eta_seconds`` (``speech.eta.estimate_eta``, as the API
   computes it) right after each submit against the actual finish, on a Piper
   worker of 2 children: a burst with no history (cold), the same burst's
   queued jobs re-estimated once a few have finished, a burst with history
   (warm), and a steady stream at 90% of capacity.

``quick=True`` scales every workload down (a smoke run). Pick scenarios with
``BENCH_WORKER_SCENARIOS=throughput,memory,eta`` (default: all), e.g.
``BENCH_WORKER_SCENARIOS=eta python -m tests.bench worker --quick``.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import statistics
import time
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from tests.reliability.helpers import WorkerEnv

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
    from webapp.speech.voices import sync_builtin_voices

    sync_builtin_voices(list_voices())


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
    from webapp.speech.runtime import recycling

    flush_queues(stack, "synth.espeak")
    env: WorkerEnv = (
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


SCENARIOS = ("throughput", "memory", "eta")
ETA_WARM_AFTER = 4  # finished jobs before the mid-burst re-estimate


def _scenarios() -> list[str]:
    raw = os.environ.get("BENCH_WORKER_SCENARIOS", "").strip()
    wanted = [w.strip() for w in raw.split(",") if w.strip()] or list(SCENARIOS)
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"unknown BENCH_WORKER_SCENARIOS {unknown}; choose from {', '.join(SCENARIOS)}")
    return wanted


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _eta_line(label: str, samples: list[tuple[float, float]]) -> str:
    """samples: (estimated, actual) seconds. Absolute error, also as % of the actual time."""
    errors = [abs(e - a) for e, a in samples]
    percent = [abs(e - a) / a * 100 for e, a in samples if a > 0]
    bias = statistics.mean(e - a for e, a in samples)
    return (
        f"ETA {label}, {len(samples)} jobs: |error| mean {statistics.mean(errors):.2f} s "
        f"({statistics.mean(percent):.0f}%), p90 {_p90(errors):.2f} s ({_p90(percent):.0f}%); "
        f"bias {bias:+.2f} s; actual mean {statistics.mean(a for _, a in samples):.2f} s"
    )


def _estimate_now(job: Any) -> tuple[float, float]:
    """(eta, when): what a GET would answer at this moment (the row re-read, as the API does)."""
    from webapp.speech.services import eta

    job.refresh_from_db()
    return float(eta.estimate_eta(job) or 0.0), time.time()


def _actuals(estimates: dict[str, tuple[float, float]]) -> list[tuple[float, float]]:
    from tests.reliability.helpers import wait_status

    rows = wait_status(list(estimates), timeout=120 + 10 * len(estimates))
    assert all(r.status == "succeeded" for r in rows), [r.status for r in rows]
    return [(estimates[str(r.id)][0], r.finished_at.timestamp() - estimates[str(r.id)][1]) for r in rows]


def _eta_accuracy(stack: Any, org: Any, jobs: int) -> list[str]:
    from tests.reliability.helpers import PIPER, flush_queues, start_worker, submit, wait_until
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import eta

    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "bench-eta", engines="piper", concurrency=2, TTS_WORKER_THREADS="1")
    lines: list[str] = []
    try:
        wait_until(lambda: sum(eta.serving_children("piper").values()) == 2, 60, "2 piper children")
        _run_jobs(org, 2, "Warm up.", PIPER)
        # Cold start: no Piper history in this (test) database, so the first
        # ETAs use DEFAULT_SECONDS_PER_CHAR.
        SynthesisJob.objects.filter(engine="piper", status__in=SynthesisJob.FINISHED).delete()
        texts = [f"{i}. {PIPER_TEXT}" for i in range(jobs)]

        estimates: dict[str, tuple[float, float]] = {}
        for text in texts:
            job = submit(org, text, voice=PIPER)
            estimates[str(job.id)] = _estimate_now(job)
        wait_until(
            lambda: (
                SynthesisJob.objects.filter(id__in=list(estimates), status="succeeded").count()
                >= ETA_WARM_AFTER
            ),
            120,
            f"{ETA_WARM_AFTER} jobs done",
            interval=0.05,
        )
        # The jobs still queued, re-estimated now that the rolling mean exists.
        rerun = {
            str(j.id): _estimate_now(j)
            for j in SynthesisJob.objects.filter(id__in=list(estimates), status="queued")
        }
        lines.append(_eta_line("at submit, cold (burst, no history)", _actuals(estimates)))
        if rerun:
            lines.append(
                _eta_line(f"re-estimated in that burst after {ETA_WARM_AFTER} finished", _actuals(rerun))
            )

        estimates = {}
        for text in texts:
            job = submit(org, text, voice=PIPER)
            estimates[str(job.id)] = _estimate_now(job)
        samples = _actuals(estimates)
        lines.append(_eta_line("at submit, warm (burst)", samples))

        # Capacity as measured by that burst (first submit to last finish), not
        # as the ETA basis predicts it: on a CPU host the children share cores.
        first = min(t for _, t in estimates.values())
        last = max(t + actual for (_, t), (_, actual) in zip(estimates.values(), samples, strict=True))
        interval = (last - first) / len(texts) / 0.9  # arrivals at 90% of capacity
        estimates = {}
        start = time.monotonic()
        for n, text in enumerate(texts):
            time.sleep(max(0.0, start + n * interval - time.monotonic()))
            job = submit(org, text, voice=PIPER)
            estimates[str(job.id)] = _estimate_now(job)
        lines.append(
            _eta_line(
                f"at submit, warm (steady, one every {interval:.2f} s = 90% of capacity)", _actuals(estimates)
            )
        )
        # What the rolling mean leaves out: per-job time outside synth_ms
        # (claim, progress writes, completion) shows up as ETA bias.
        done = SynthesisJob.objects.filter(
            organization=org, engine="piper", status="succeeded", text_chars__gt=100
        ).values_list("started_at", "finished_at", "metrics__synth_ms")
        # Succeeded jobs have both times (the fields are nullable only for jobs not run yet).
        walls = [(cast(dt.datetime, f) - cast(dt.datetime, s)).total_seconds() for s, f, _ in done]
        synths = [ms / 1000 for _, _, ms in done]
        lines.append(
            f"ETA basis check, {len(walls)} jobs: claim->finish mean {statistics.mean(walls):.2f} s, "
            f"synth_ms mean {statistics.mean(synths):.2f} s (outside the rolling mean: "
            f"{statistics.mean(walls) - statistics.mean(synths):.2f} s per job)"
        )
        return lines
    finally:
        stack.stop_service(worker)


def run_eta(quick: bool) -> list[str]:
    """The ETA accuracy scenario alone (same as BENCH_WORKER_SCENARIOS=eta)."""
    os.environ["BENCH_WORKER_SCENARIOS"] = "eta"
    return run(quick)


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
        scenarios = _scenarios()
        jobs = 4 if quick else 12
        if "throughput" in scenarios:
            a_rate, a_wall = _throughput(stack, org, concurrency=1, threads=2, jobs=jobs)
            b_rate, b_wall = _throughput(stack, org, concurrency=2, threads=1, jobs=jobs)
            say(
                f"piper, {jobs} jobs of {len(PIPER_TEXT)} chars: 1 child x 2 threads {a_rate:.1f} audio s/s ({a_wall:.1f} s); "
                f"2 children x 1 thread {b_rate:.1f} audio s/s ({b_wall:.1f} s); ratio {b_rate / a_rate:.2f}"
            )
        marks = [10, 30, 60] if quick else [20, 100, 500]
        for recycle in (True, False) if "memory" in scenarios else ():
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
        if "eta" in scenarios:
            eta_jobs = 8 if quick else 20
            say(
                f"ETA scenario: Piper worker, 2 children x 1 thread, {eta_jobs} jobs of ~{len(PIPER_TEXT)} chars per round"
            )
            for line in _eta_accuracy(stack, org, eta_jobs):
                say(line)
        SynthesisJob.objects.filter(organization=org).delete()
        Organization.objects.filter(pk=org.pk).delete()
    finally:
        if owned:
            stack.stop_all()
    return lines


if __name__ == "__main__":
    import sys

    run(quick="--quick" in sys.argv)
