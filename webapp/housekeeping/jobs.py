"""The housekeeping jobs that keep disk, database and queues clean: the framework.

Each job is a function of a :class:`Context` registered in :data:`JOBS` by the
``@job`` decorator, in a module per family (``catalog`` imports them all): ``synthesis`` (audio retention,
lease reaper, re-dispatch), ``disk`` (orphan files, temp folders),
``voices`` (stale and deleted voice prompts), ``records`` (idempotency
keys, run records, heartbeats, operations snapshots) and ``operations`` (the
operations page's minute snapshot). :func:`run_job` runs one under a Redis lock
(two runs never overlap), with a time budget, records a
:class:`HousekeepingRun` row and logs one line with what it did. Celery beat
calls them through ``webapp.housekeeping.tasks``; ``manage.py housekeeping
<job>`` runs them by hand. Everything a job changes about jobs goes through
``webapp.speech.lifecycle``, the same transitions the workers use, so there is
one version of each state change.

Every job is idempotent and works in batches of ``TTS_HOUSEKEEPING_BATCH``:
a run that hits its time budget stops between batches, and the next run
continues where it left off.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.housekeeping import locks
from webapp.housekeeping.models import HousekeepingRun

log = logging.getLogger("webapp.housekeeping")


# --------------------------------------------------------------------- framework


@dataclass
class Context:
    """What a job run gets: the time it runs at, its batch size and its deadline."""

    now: dt.datetime
    batch: int
    deadline: float  # time.monotonic() value
    counts: dict[str, int] = field(default_factory=dict)
    partial: bool = False

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(amount)

    def out_of_time(self) -> bool:
        """True when the budget is spent; the run is then recorded as partial."""
        if time.monotonic() >= self.deadline:
            self.partial = True
        return self.partial


@dataclass(frozen=True)
class Job:
    name: str
    run: Callable[[Context], None]
    description: str


@dataclass(frozen=True)
class RunResult:
    job: str
    skipped: bool
    outcome: str  # ok | partial | error | skipped
    counts: dict[str, int]
    duration_ms: int

    def summary(self) -> str:
        if self.skipped:
            return f"{self.job}: skipped (another run holds the lock)"
        parts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "nothing to do"
        return f"{self.job}: {self.outcome} {parts} duration_ms={self.duration_ms}"


JOBS: dict[str, Job] = {}


def job(name: str, description: str) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    def register(func: Callable[[Context], None]) -> Callable[[Context], None]:
        JOBS[name] = Job(name=name, run=func, description=description)
        return func

    return register


def soft_time_limit() -> int:
    return int(settings.TTS_HOUSEKEEPING_SOFT_TIME_LIMIT)


def hard_time_limit() -> int:
    return soft_time_limit() + 60


def lock_ttl() -> int:
    # Longer than the hard limit: a run Celery killed frees its lock by expiry,
    # a live run can never lose it.
    return hard_time_limit() + 60


def run_job(
    name: str,
    *,
    now: dt.datetime | None = None,
    batch: int | None = None,
    budget_seconds: float | None = None,
) -> RunResult:
    """Run one job unless another run of it holds the lock. Logs one line, records the run."""
    try:
        spec = JOBS[name]
    except KeyError:
        raise ValueError(f"unknown housekeeping job {name!r}; known: {', '.join(sorted(JOBS))}") from None
    with locks.hold(name, lock_ttl()) as acquired:
        if not acquired:
            log.info("housekeeping %s: skipped, another run holds the lock", name)
            return RunResult(name, True, "skipped", {}, 0)
        started = time.monotonic()
        started_at = now or timezone.now()
        # Stop between batches well before Celery's soft limit interrupts us mid-batch.
        # A manual --budget is capped too, so a run never outlives its lock's TTL.
        budget = soft_time_limit() * 0.8 if budget_seconds is None else min(budget_seconds, soft_time_limit())
        ctx = Context(
            now=started_at, batch=batch or settings.TTS_HOUSEKEEPING_BATCH, deadline=started + budget
        )
        outcome, error = HousekeepingRun.Outcome.OK, ""
        failure: BaseException | None = None
        try:
            spec.run(ctx)
        except SoftTimeLimitExceeded:
            outcome, error = HousekeepingRun.Outcome.PARTIAL, "soft time limit exceeded"
        except Exception as exc:
            outcome, error, failure = HousekeepingRun.Outcome.ERROR, f"{type(exc).__name__}: {exc}", exc
        else:
            if ctx.partial:
                outcome = HousekeepingRun.Outcome.PARTIAL
        duration_ms = int((time.monotonic() - started) * 1000)
        result = RunResult(name, False, str(outcome), dict(ctx.counts), duration_ms)
        if failure is None:
            log.info("housekeeping %s", result.summary())
        else:
            log.error("housekeeping %s error=%s", result.summary(), error, exc_info=failure)
        _record(result, started_at, error)
        if failure is not None:
            raise failure
        return result


def _record(result: RunResult, started_at: dt.datetime, error: str) -> None:
    """A row for the admin; runs that found nothing to do (most runs of the 30 s jobs) are only logged."""
    if result.outcome == HousekeepingRun.Outcome.OK and not any(result.counts.values()):
        return
    try:
        HousekeepingRun.objects.create(
            job=result.job,
            started_at=started_at,
            duration_ms=result.duration_ms,
            outcome=result.outcome,
            counts=result.counts,
            error=error[:1000],
        )
    except Exception as exc:  # the record is secondary to the work done
        log.warning("housekeeping %s: could not record the run: %s", result.job, exc)


def delete_in_batches(qs: models.QuerySet[Any], ctx: Context) -> int:
    deleted = 0
    while not ctx.out_of_time():
        pks = list(qs.order_by().values_list("pk", flat=True)[: ctx.batch])
        if not pks:
            break
        n, _ = qs.model.objects.filter(pk__in=pks).delete()
        deleted += n
        if len(pks) < ctx.batch:
            break
    return deleted
