"""The operations snapshot: the operations page's figures once a minute, for its 24-hour charts and /metrics."""

from __future__ import annotations

from webapp.housekeeping.jobs import Context, job
from webapp.housekeeping.models import OperationsSnapshot


@job(
    "snapshot_operations",
    "Store this minute's operations figures (workers, queues, jobs, recycles); count finished jobs for /metrics.",
)
def snapshot_operations(ctx: Context) -> None:
    from webapp.metrics import rollup
    from webapp.speech import operations

    figures = operations.collect()
    OperationsSnapshot.objects.create(at=ctx.now, data=operations.snapshot(figures))
    # Only logged: a row per minute in the run records would bury the runs that did something.
    rollup.advance()
