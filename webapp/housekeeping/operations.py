"""The operations snapshot: the operations page's figures once a minute, for its 24-hour charts and /metrics."""

from __future__ import annotations

from webapp.housekeeping.jobs import Context, job
from webapp.housekeeping.models import OperationsSnapshot
from webapp.metrics import rollup
from webapp.speech import operations


@job(
    "snapshot_operations",
    "Store this minute's operations figures (workers, queues, jobs, recycles); count finished jobs for /metrics.",
)
def snapshot_operations(ctx: Context) -> None:
    figures = operations.collect()
    # One row a minute whatever runs (two beats, a run by hand): a later run in the same
    # minute finds the minute's row and leaves it; the unique minute settles a race.
    OperationsSnapshot.objects.get_or_create(
        at=ctx.now.replace(second=0, microsecond=0), defaults={"data": operations.snapshot(figures)}
    )
    # Only logged: a row per minute in the run records would bury the runs that did something.
    rollup.advance()
