"""Dispatch latency to an idle worker, split by stage: `python -m tests.bench dispatch [--quick]`.

One Piper worker of the default layout on the test stack; jobs submitted one
at a time through the services (no HTTP), each waited for before the next, so
the worker is idle at every submit. Per job, on the one host clock:

* submit: ``created_at`` -> ``submit_job`` returned (the transaction, the
  commit, and the after-commit send, which runs in the caller's thread);
* publish: ``created_at`` -> ``dispatched_at`` (set once the message is sent);
* received: -> the worker parent logs the message received (``celery.worker.strategy``);
* claimed: -> the child logs its claim (``tasks``: "attempt 1 claimed");
* queue_ms: what the job's metrics record (claim time - ``created_at``), the
  figure issue 15's goal is about (p99 < 50 ms).

The stage times come from the worker's log lines (millisecond stamps), so the
split is a diagnosis, not a figure to the millisecond.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from tests.bench.bench_peer import pct

if TYPE_CHECKING:
    from tests.reliability.helpers import WorkerEnv

TEXT = "Hi."
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _log_times(log: Path, pattern: str) -> dict[str, float]:
    """{key: epoch seconds} of the log lines matching ``pattern`` (one group: the key)."""
    found: dict[str, float] = {}
    rx = re.compile(pattern)
    for line in log.read_text(errors="replace").splitlines():
        m, s = rx.search(line), STAMP.match(line)
        if m and s:
            stamp = dt.datetime.strptime(s.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone()
            found[m.group(1)] = stamp.timestamp()
    return found


def _jobs(org: Any, n: int, voice: str) -> list[tuple[Any, float]]:
    """Submit n jobs one after the other, each waited for; (row, submit-returned epoch)."""
    from tests.reliability.helpers import submit, wait_status

    out = []
    for i in range(n):
        job = submit(org, f"{TEXT} {i}", voice=voice)
        returned = time.time()
        (row,) = wait_status([job.id], timeout=60)
        assert row.status == "succeeded", row.status
        out.append((row, returned))
        time.sleep(0.2)  # the child is back waiting on its queue
    return out


def measure(stack: Any, n: int, label: str, **env: Unpack[WorkerEnv]) -> list[str]:
    from tests.reliability.helpers import PIPER, flush_queues, make_org, start_worker

    flush_queues(stack, "synth.piper")
    name = "bench-dispatch"
    worker = start_worker(stack, name, engines="piper", concurrency=2, **env)
    try:
        org = make_org(f"bench-dispatch-{time.time_ns()}")
        _jobs(org, 2, PIPER)  # warm: connections, the first message of each child
        rows = _jobs(org, n, PIPER)
    finally:
        stack.stop_service(worker)
    log = Path(stack.cfg.log_dir) / f"{name}.log"
    # Celery logs the task id, not the job: jobs run one at a time, so a job's message is
    # the first one received after it was created.
    received = sorted(_log_times(log, r"Task speech\.synthesize_job\[([^\]]+)\] received").values())
    claimed = _log_times(log, r"job ([0-9a-f-]{36}): attempt \d+ claimed")
    stages: dict[str, list[float]] = {k: [] for k in ("submit", "publish", "received", "claimed", "queue_ms")}
    for row, returned in rows:
        created = row.created_at.timestamp()
        stages["submit"].append(returned - created)
        stages["publish"].append(row.dispatched_at.timestamp() - created)
        after = [t for t in received if t >= created - 0.001]
        if after:
            stages["received"].append(after[0] - created)
        if str(row.id) in claimed:
            stages["claimed"].append(claimed[str(row.id)] - created)
        stages["queue_ms"].append(row.metrics["queue_ms"] / 1000)
    return [
        f"| {label} | {stage} | {len(v)} | {pct(v, 50) * 1000:.0f} | {pct(v, 99) * 1000:.0f} |"
        for stage, v in stages.items()
        if v
    ]


# Celery's default (a new PostgreSQL connection per task) against ours (kept, closed when stale).
VARIANTS: dict[str, WorkerEnv] = {"connection per task": {"CELERY_DB_REUSE_MAX": "0"}, "connection kept": {}}


def run(quick: bool) -> list[str]:
    from tests.bench.bench_worker import _setup, _voices

    stack, owned = _setup()
    _voices()
    lines = ["| worker | stage (from created_at) | jobs | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    try:
        for round_ in range(2):  # interleaved: the load of a shared machine drifts
            for name, env in VARIANTS.items():
                label = f"{name} ({round_ + 1})"
                lines += measure(stack, 10 if quick else 30, label, **env)
    finally:
        if owned:
            stack.stop_all()
    for line in lines:
        print(line)
    return lines
