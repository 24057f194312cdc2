"""Dispatch to an idle worker: what a job's claim costs before synthesis starts.

Celery's Django fix-up opens a new PostgreSQL connection for every task unless
``CELERY_DB_REUSE_MAX`` is set; on a busy host that was 15-25 ms of each
job's dispatch latency (tests/bench/bench_dispatch.py). A child keeps its
connection from one job to the next.
"""

from __future__ import annotations

import psutil
import pytest
from django.db import connection

from tests.reliability.helpers import SHORT, flush_queues, make_org, start_worker, submit, wait_status
from tests.stack import CFG, TestStack
from webapp.speech.models import SynthesisJob

pytestmark = pytest.mark.django_db(transaction=True)


def _backends(pid: int) -> set[int]:
    """PostgreSQL backend pids of the connections process ``pid``'s jobs use.

    The child's watchdog thread holds a connection of its own once it
    has checked a running attempt (every ``WATCHDOG_INTERVAL``, so only when a
    job overlaps a beat). That one is told apart by its last statement, the
    watchdog's only query, and left out.
    """
    ports = [
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == CFG.pg_port and c.status == psutil.CONN_ESTABLISHED
    ]
    if not ports:
        return set()
    watchdog = str(SynthesisJob.objects.values_list("id", "claim_token").query).split(" FROM ")[0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, query FROM pg_stat_activity WHERE client_port = ANY(%s)", [ports])
        return {pid for pid, query in cursor.fetchall() if not query.startswith(watchdog)}


def test_a_worker_child_keeps_its_database_connection_from_one_job_to_the_next(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.espeak")
    org = make_org("dispatch-reuse")
    worker = start_worker(stack, "w-dispatch", engines="espeak", concurrency=1)
    try:
        (first,) = wait_status([submit(org, SHORT).id])
        child = int(first.worker.rsplit(":", 1)[1])
        after_first = _backends(child)
        (second,) = wait_status([submit(org, f"{SHORT} Again.").id])
        assert (first.status, second.status) == ("succeeded", "succeeded")
        assert second.worker == first.worker  # the same child took both
        assert after_first, "the child closed its database connection after the job"
        assert _backends(child) == after_first
    finally:
        stack.stop_service(worker)
