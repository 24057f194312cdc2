"""Celery tasks for the housekeeping jobs: one task per job, ``housekeeping.<job>``.

Thin: each calls :func:`webapp.housekeeping.jobs.run_job`, which takes the
Redis lock, works in batches and logs. They run on the ``housekeeping`` queue
(the housekeeping worker consumes ``default,housekeeping``) with a soft time
limit; the job stops between batches before that limit, and the limit is the
backstop. ``acks_late`` is off: a run lost with its worker is simply done again
by the next beat tick, instead of being redelivered on top of it.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

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
    return shared_task(
        name=task_name(job),
        queue=QUEUE,
        soft_time_limit=soft_time_limit(),
        time_limit=hard_time_limit(),
        acks_late=False,
        ignore_result=True,
    )(run)


TASKS: dict[str, Any] = {job: _make_task(job) for job in JOBS}
