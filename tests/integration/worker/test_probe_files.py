"""A real worker's probe files (webapp/speech/runtime/probe.py), with its child busy on a job:
ready once its model is loaded, live through a Redis restart while its watchdog keeps reading the
job's row, not live while the child is frozen (when the watchdog is frozen with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.reliability.helpers import children, flush_queues, job, make_org, start_worker, submit, wait_until
from tests.stack import CFG, TestStack

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[3]
INTERVAL = 0.5  # the worker's TTS_HEARTBEAT_INTERVAL (tests.reliability.helpers.start_worker)
MAX_AGE = 3 * INTERVAL + 1
MARKER = "#probe-hang#"


def _probe(what: str, node: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "webapp.speech.runtime.probe", what, "--max-age", str(MAX_AGE)]
    return subprocess.run(
        [*command, "--node", node],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ.copy(),
    )


def _child_file(pid: int) -> Path:
    folder = Path(settings.TTS_WORKER_PROBE_DIR)
    for path in folder.glob("worker-*.alive"):
        try:
            if int(path.read_text().split()[1]) == pid:
                return path
        except (FileNotFoundError, IndexError, ValueError):
            continue
    raise AssertionError(f"no probe file of child {pid} in {folder}")


def _wait(what: str, node: str, rc: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (done := _probe(what, node)).returncode != rc:
        assert time.monotonic() < deadline, done.stdout + done.stderr[-1000:]
        time.sleep(0.5)


def _watchdog_reads() -> Callable[[], set[Any]]:
    """A reader of the start times of the watchdog's latest reads of the jobs' table: its connection
    stays open, and PostgreSQL shows each backend's last statement and when it began."""
    from webapp.speech.models import SynthesisJob

    select = str(SynthesisJob.objects.values_list("id", "claim_token").query).split(" FROM ")[0]
    observer = psycopg.connect(CFG.database_url, autocommit=True)

    def reads() -> set[Any]:
        rows = observer.execute(
            "SELECT query_start FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
            [select + "%"],
        ).fetchall()
        return {r[0] for r in rows}

    return reads


@pytest.fixture
def busy_worker(
    stack: TestStack, builtin_voices: list[str], no_session_worker: None
) -> Iterator[tuple[Service, int]]:
    """A worker of its own whose only child runs a job that hangs (tests/faults.py): its pid."""
    flush_queues(stack, "synth.espeak")
    worker = start_worker(stack, "w-probe", TTS_FAULT_HANG_MARKER=MARKER)
    try:
        busy = submit(make_org("probe"), f"This text {MARKER} keeps its worker busy.")
        row = wait_until(lambda: (r := job(busy.id)).status == "running" and r, 30, "the job to start")
        pid = int(row.worker.rpartition(":")[2])
        assert pid in {p.pid for p in children(worker)}
        yield worker, pid
    finally:
        stack.stop_service(worker)


def test_a_busy_worker_is_ready_live_through_a_redis_restart_and_not_live_when_frozen(
    stack: TestStack, busy_worker: tuple[Service, int]
) -> None:
    _worker, pid = busy_worker
    path = _child_file(pid)
    node = path.name[len("worker-") : path.name.rindex("-")]
    assert _probe("ready", node).returncode == 0
    assert _probe("live", node).returncode == 0
    reads = _watchdog_reads()
    wait_until(lambda: len(reads()) > 0, 10, "a read of the watchdog")

    redis = next(s for s in stack.sup.services if s.name == "redis")
    stack.stop_service(redis)  # SIGTERM: a Redis restart
    try:
        seen = reads()
        time.sleep(MAX_AGE + INTERVAL)  # longer than a file may age: it was rewritten meanwhile
        assert _probe("live", node).returncode == 0, path.read_text()
        assert _probe("ready", node).returncode == 0
        # The watchdog kept reading the busy child's job all along (the database was there).
        assert reads() - seen, "the watchdog made no read while Redis was away"
    finally:
        stack.start_service(Service("redis", deploy_stack.redis_command(CFG), ready_port=CFG.redis_port))

    os.kill(pid, signal.SIGSTOP)  # a frozen child: no thread of it runs, its watchdog's neither
    try:
        _wait("live", node, rc=1)
        assert _probe("ready", node).returncode == 1
        frozen = reads()
        time.sleep(3 * INTERVAL)
        assert reads() == frozen, "a frozen child's watchdog read"
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait("live", node, rc=0)
    _wait("ready", node, rc=0)
    wait_until(lambda: reads() - frozen, 10, "the watchdog reading again")
    assert job(_busy_job_id(pid)).status == "running"  # nothing of this ended the job


def _busy_job_id(pid: int) -> Any:
    from webapp.speech.models import SynthesisJob

    return SynthesisJob.objects.get(worker__endswith=f":{pid}", status="running").id
