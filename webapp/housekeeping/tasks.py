"""Celery tasks for the housekeeping jobs: one task per job, ``housekeeping.<job>``.

Thin: each calls :func:`webapp.housekeeping.jobs.run_job`, which takes the
Redis lock, works in batches and logs. They run on the ``housekeeping`` queue
(the housekeeping worker consumes ``default,housekeeping``) with a soft time
limit; the job stops between batches before that limit, and the limit is the
backstop. ``acks_late`` is off: a run lost with its worker is simply done again
by the next beat tick, instead of being redelivered on top of it.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from celery import signals
from django.conf import settings

# The project's app, as every task of this service: a worker must use the configured broker.
from webapp.celery import app
from webapp.housekeeping import locks
from webapp.housekeeping.catalog import JOBS, run_job
from webapp.housekeeping.jobs import hard_time_limit, soft_time_limit

QUEUE = "housekeeping"


def task_name(job: str) -> str:
    return f"housekeeping.{job}"


def _make_task(job: str) -> Any:
    def run() -> dict[str, Any]:
        result = run_job(job)
        return {"skipped": result.skipped, "outcome": result.outcome, "counts": result.counts}

    run.__name__ = run.__qualname__ = job
    run.__doc__ = JOBS[job].description
    return app.task(
        name=task_name(job),
        queue=QUEUE,
        soft_time_limit=soft_time_limit(),
        time_limit=hard_time_limit(),
        acks_late=False,
        ignore_result=True,
    )(run)


TASKS: dict[str, Any] = {job: _make_task(job) for job in JOBS}


@signals.beat_init.connect
def _take_beat_lease(**_: Any) -> None:
    """Beat sends nothing before it holds the lease: a second beat waits here (docs/housekeeping.md).

    Sent by beat's service before its first tick, in every beat process (this
    module is imported as beat loads the tasks), never in a worker.
    """
    lease = locks.BeatLease(settings.TTS_BEAT_LEASE_SECONDS)
    lease.wait_and_take()
    atexit.register(lease.release)
    # Lost: another beat may be sending now. Exit non-zero at once (no clean exit, which
    # systemd's Restart=on-failure would not restart); restarted, this beat waits.
    lease.keep(on_lost=lambda: os._exit(1))
