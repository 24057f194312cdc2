"""Housekeeping of synthesis jobs: audio and text past retention, expired leases, undispatched messages."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone

from webapp.housekeeping.jobs import Context, job
from webapp.speech import lifecycle, sessions
from webapp.speech.models import SynthesisJob
from webapp.speech.services import dispatch

JobStatus = SynthesisJob.Status


def expired_job_ids(now: dt.datetime, limit: int) -> list[Any]:
    """Succeeded jobs whose audio is past retention, oldest first (a plain read, no lock); not those
    whose client is still being handed the answer (lifecycle.expire_audio leaves them)."""
    return list(
        SynthesisJob.objects.filter(
            status=JobStatus.SUCCEEDED, expires_at__lte=now, waiter_until__isnull=True
        )
        .order_by("expires_at", "id")
        .values_list("id", flat=True)[:limit]
    )


@job("expire_audio", "Remove audio past the tenant's retention, mark the job expired, release storage.")
def expire_audio(ctx: Context) -> None:
    # The listing is a plain read and may be stale by the time a row is reached;
    # lifecycle.expire_audio re-checks status and expires_at under the row lock,
    # so a job that changed meanwhile (finished anew, deleted) is left alone.
    while not ctx.out_of_time():
        ids = expired_job_ids(ctx.now, ctx.batch)
        if not ids:
            break
        for job_id in ids:
            ctx.add("bytes_released", lifecycle.expire_audio(job_id))
        expired = SynthesisJob.objects.filter(id__in=ids, status=JobStatus.EXPIRED).count()
        ctx.add("expired", expired)
        if expired == 0 or len(ids) < ctx.batch:
            break


@job(
    "blank_old_texts",
    "Blank the text of jobs finished longer ago than their plan's text_retention_days; the rows stay.",
)
def blank_old_texts(ctx: Context) -> None:
    while not ctx.out_of_time():
        blanked = lifecycle.blank_old_texts(limit=ctx.batch)
        ctx.add("blanked", blanked)
        if blanked < ctx.batch:
            break


@job(
    "reap_stuck_jobs",
    "Re-queue running jobs whose lease expired (fail them worker_lost when attempts run out); close "
    "realtime sessions whose web process stopped renewing them.",
)
def reap_stuck_jobs(ctx: Context) -> None:
    while not ctx.out_of_time():
        requeued, failed = lifecycle.requeue_expired_leases(limit=ctx.batch)
        ctx.add("requeued", requeued)
        ctx.add("failed", failed)
        if requeued + failed < ctx.batch:
            break
    ctx.add("sessions_closed", sessions.close_lapsed(limit=ctx.batch))


@job("redispatch_jobs", "Send the message of queued jobs that were never dispatched (broker down at submit).")
def redispatch_jobs(ctx: Context) -> None:
    while not ctx.out_of_time():
        sent = dispatch.redispatch_undispatched(limit=ctx.batch)
        ctx.add("dispatched", sent)
        if sent < ctx.batch:
            break
    cutoff = timezone.now() - dt.timedelta(seconds=settings.TTS_DISPATCH_GRACE_SECONDS)
    # Non-zero here after a run means the broker is still unreachable.
    ctx.add(
        "still_undispatched",
        SynthesisJob.objects.filter(
            status=JobStatus.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff
        ).count(),
    )


@job(
    "sweep_lost_deliveries",
    "Re-send the message of jobs queued longer than TTS_JOB_REDELIVER_SECONDS; end jobs queued too long.",
)
def sweep_lost_deliveries(ctx: Context) -> None:
    # One pass per run: the re-sent jobs move their dispatched_at on, so a
    # second pass in the same run would find only what the batch left over.
    resent, timed_out = resend_lost_deliveries(limit=ctx.batch)
    ctx.add("resent", resent)
    ctx.add("queue_timeout", timed_out)


def resend_lost_deliveries(limit: int = 500) -> tuple[int, int]:
    """(re-sent, timed out): jobs queued too long end ``queue_timeout`` (the lifecycle), then the
    queued jobs whose message the broker lost get it again (dispatch, which asks the broker)."""
    timed_out = lifecycle.fail_queue_timeouts(limit)
    return dispatch.resend_lost(limit), timed_out
