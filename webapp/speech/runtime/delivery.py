"""One delivery of a synthesis message: claim a job, run it, let the child check itself.

The message is a wake-up (``claims.claim_for_message`` decides which job it
takes); the claimed job runs through the attempt runner (``attempt.run_claimed``),
or, on a batching child and for a remote model, with the jobs claimed beside it
(``batching.run_group``).
Whatever happens, the child decides afterwards whether it should be replaced
(``worker.after_task``). A database that stays unreachable hands the message back.
"""

from __future__ import annotations

import logging

from celery.exceptions import Reject

from webapp.speech.runtime import batching, claims, mode, recycling, worker
from webapp.speech.runtime.attempt import SKIPPED, JobLost, run_claimed

log = logging.getLogger(__name__)


def deliver(job_id: str, limits: list[float] | None) -> str:
    """Handle one message for ``job_id`` in this child; returns the outcome's name for the log."""
    state = worker.current()
    if not state.ready:
        # Should not happen (the child loads before taking work); never run without a model.
        recycling.request_exit("not_loaded child took a task without a model")
        raise Reject("worker child has no model", requeue=True)
    outcome = SKIPPED
    claimed = None
    grouped = False
    try:
        claimed = claims.claim_for_message(state, job_id, limits)
        if claimed is not None and mode.jobs_at_once(claimed[0].engine, state.models) > 1:
            # A GPU child on torch batching, or a remote model's relay: several jobs at once,
            # each in a thread (runtime/batching.py), which counts each job for the child itself.
            grouped = True
            return batching.run_group(state, claimed)
        if claimed is not None:
            outcome = run_claimed(state, *claimed)
            claims.ended(claimed[0])
    except JobLost as exc:
        log.error("job %s: %s; message handed back", job_id, exc)
        raise Reject(str(exc), requeue=True) from exc
    finally:
        state.current_job = None
        state.attempts.clear()  # a job claimed and never run (the database went away) is not watched
        if not grouped:
            worker.after_task(
                state,
                outcome.engine,
                outcome.cpu_seconds,
                outcome.characters,
                oom=outcome.out_of_memory,
                ran=claimed is not None,
            )
    return outcome.name
