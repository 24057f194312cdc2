"""Housekeeping of records: idempotency keys past their TTL, old run records, audit events and
operations snapshots, webhook messages done with, finished jobs' dictionary pins, word timestamps
whose audio is gone, heartbeats without a TTL."""

from __future__ import annotations

import datetime as dt

from django.conf import settings

from webapp import redis_clients
from webapp.audit.models import AuditEvent
from webapp.housekeeping.jobs import Context, delete_in_batches, job
from webapp.housekeeping.models import HousekeepingRun, OperationsSnapshot
from webapp.speech import heartbeat
from webapp.speech.models import FINISHED_STATUSES, IdempotencyKey, JobTimestamps, SynthesisJob
from webapp.webhooks.models import WebhookMessage

Pin = SynthesisJob.pinned_dictionary_versions.through
DONE_MESSAGES = (WebhookMessage.Status.DELIVERED, WebhookMessage.Status.FAILED)


@job(
    "prune_records",
    "Delete idempotency keys past their TTL, old run records, audit events and operations snapshots, "
    "webhook messages delivered or given up (with their attempts) past TTS_WEBHOOK_RETENTION_DAYS, "
    "finished jobs' dictionary pins past TTS_DICTIONARY_PIN_RETENTION_HOURS and word timestamps whose "
    "audio is gone; give TTL-less heartbeats a TTL.",
)
def prune_records(ctx: Context) -> None:
    keys_cutoff = ctx.now - dt.timedelta(hours=settings.TTS_IDEMPOTENCY_TTL_HOURS)
    ctx.add(
        "idempotency_keys", delete_in_batches(IdempotencyKey.objects.filter(created_at__lt=keys_cutoff), ctx)
    )
    runs_cutoff = ctx.now - dt.timedelta(days=settings.TTS_AUDIT_RETENTION_DAYS)
    ctx.add("run_records", delete_in_batches(HousekeepingRun.objects.filter(started_at__lt=runs_cutoff), ctx))
    ctx.add("audit_events", delete_in_batches(AuditEvent.objects.filter(at__lt=runs_cutoff), ctx))
    snapshots_cutoff = ctx.now - dt.timedelta(hours=settings.TTS_OPERATIONS_SNAPSHOT_HOURS)
    ctx.add(
        "operations_snapshots",
        delete_in_batches(OperationsSnapshot.objects.filter(at__lt=snapshots_cutoff), ctx),
    )
    # The delivery log a tenant reads; a message still pending is kept whatever its age (the
    # sweep gives it up at the end of its retry window first). Its attempts go with it (cascade).
    webhooks_cutoff = ctx.now - dt.timedelta(days=settings.TTS_WEBHOOK_RETENTION_DAYS)
    done = WebhookMessage.objects.filter(
        status__in=DONE_MESSAGES,
        created_at__lt=webhooks_cutoff,
    )
    ctx.add("webhook_messages_and_attempts", delete_in_batches(done, ctx))
    # A pin keeps a dictionary version from deletion while its job needs it; once the job has
    # ended it protects nothing (the job keeps its record of what it applied), one row a job.
    pins_cutoff = ctx.now - dt.timedelta(hours=settings.TTS_DICTIONARY_PIN_RETENTION_HOURS)
    ended = Pin.objects.filter(
        synthesisjob__status__in=FINISHED_STATUSES, synthesisjob__finished_at__lt=pins_cutoff
    )
    ctx.add("dictionary_pins", delete_in_batches(ended, ctx))
    # Timestamps go with their audio (lifecycle.expire_audio); any left beside a job holding no
    # audio (written before that rule, or by a path that missed it) describe nothing and still count.
    ctx.add("orphan_timestamps", delete_in_batches(JobTimestamps.objects.filter(job__audio_bytes=0), ctx))
    # Heartbeats expire by TTL; one written without (a bug, a manual SET) would
    # show a dead worker as live forever. Give it the TTL it should have had.
    r = redis_clients.heartbeats()
    for key in r.scan_iter(match=heartbeat.KEY_PREFIX + "*", count=ctx.batch):
        if r.ttl(key) == -1:
            r.expire(key, settings.TTS_HEARTBEAT_TTL)
            ctx.add("heartbeats_given_ttl")
