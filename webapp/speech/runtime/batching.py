"""Several jobs at once in one worker child: a batching GPU child, and a remote model's relay.

On a worker with ``TTS_WORKER_PIPER_RUNTIME=torch`` and ``TTS_WORKER_BATCH_JOBS``
over 1, a message does not run one job. It claims its job as any message does
(``claims.claim_for_message``), then more queued jobs of the same engine,
fairest first (``lifecycle.claim_next``), up to ``TTS_WORKER_BATCH_JOBS``, and
runs each in its own thread with ``attempt.run_claimed``: the same claim and
fencing token, progress, cancel flag, limits, per-attempt file and settling as
a job of a CPU child. Their sentences meet in the engine's batcher
(``synth.batching``), which synthesises what is waiting in one batched pass;
an error of one sentence reaches only its own job. A job that ends makes room
for the next queued one while a job claimed now still ends inside the
message's Celery time limit; jobs queued meanwhile join within half a
second while there is room. The message returns once all its jobs are
settled; each of them counts as a task for the child's recycle check.
docs/gpu.md, "Execution model for GPU batching".

A remote model's jobs (synth/engines/remote.py) run the same way on any worker, up to
the model's ``jobs_per_process``: each job's thread spends its time waiting on its
upstream's stream, so one child relays dozens where a child per job would hold a
process's memory each (docs/engines.md, "Remote engines").
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from celery.exceptions import Reject
from django.conf import settings
from django.db import connections

from webapp.speech.models import SynthesisJob
from webapp.speech.runtime import claims, mode, recycling, worker
from webapp.speech.runtime.attempt import JobLost, Outcome, run_claimed

log = logging.getLogger(__name__)

REFILL_POLL_SECONDS = 0.5

Claimed = tuple[SynthesisJob, tuple[float, float]]


def run_group(state: worker.WorkerState, first: Claimed) -> str:
    """One message's claimed job and the jobs claimed beside it, each in a thread."""
    group = _Group(state, first[0].engine)
    try:
        names = group.run(first)
    finally:
        state.attempts.clear()  # a job claimed and never run (the database went away) is not watched
    if group.lost:
        # The database stayed away: the jobs it could not settle wait for their owner to be seen gone.
        raise Reject("database unreachable", requeue=True)
    return "group:" + ",".join(names)


class _Group:
    """The jobs one message runs at once, and the claims that refill it."""

    def __init__(self, state: worker.WorkerState, engine: str) -> None:
        self.state = state
        self.engine = engine
        self.size = mode.jobs_at_once(engine, state.models)
        self.started = time.monotonic()
        self.lost = False

    def run(self, first: Claimed) -> list[str]:
        names: list[str] = []
        with ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="batch-job") as pool:
            running: set[Future[Outcome | None]] = {pool.submit(self._one, *first)}
            while running:
                while len(running) < self.size and (claimed := self._claim_more()) is not None:
                    running.add(pool.submit(self._one, *claimed))
                # With room left, look for newly queued jobs now and then: their messages
                # wait behind this one in this child, and they should join the batches now.
                room = len(running) < self.size and self._may_claim()
                done, running = wait(running, REFILL_POLL_SECONDS if room else None, FIRST_COMPLETED)
                for future in done:
                    names.append(self._count(future.result()))
        return names

    def _may_claim(self) -> bool:
        """Room for one more job: the child is staying, and a job claimed now ends inside the message's limit.

        Celery's limit is TTS_MAX_JOB_SECONDS + 2 x grace; no job's deadline is
        later than TTS_MAX_JOB_SECONDS + grace after its claim.
        """
        return (
            time.monotonic() - self.started < settings.TTS_JOB_HARD_GRACE_SECONDS
            and not recycling.exit_requested()
            and not worker.handing_back()
            and not self.lost
        )

    def _claim_more(self) -> Claimed | None:
        if not self._may_claim():
            return None
        try:
            job = claims.claim_next(self.state, self.engine)
        except JobLost:
            self.lost = True
            return None
        return None if job is None else (job, claims.limits_of(job))

    def _one(self, job: SynthesisJob, limits: tuple[float, float]) -> Outcome | None:
        """One job in its own thread; None when the database stayed away."""
        try:
            outcome = run_claimed(self.state, job, limits)
            claims.ended(job)
            return outcome
        except JobLost as exc:
            log.error("job %s: %s; left to the lease reaper", job.id, exc)
            self.lost = True
            return None
        finally:
            connections.close_all()  # this thread's own connections

    def _count(self, outcome: Outcome | None) -> str:
        """Each job is a task for the child's health check (drift, memory, out-of-memory)."""
        if outcome is None:
            worker.after_task(self.state, None, None, 0)
            return "lost"
        worker.after_task(
            self.state, outcome.engine, outcome.cpu_seconds, outcome.characters, oom=outcome.out_of_memory
        )
        return outcome.name
