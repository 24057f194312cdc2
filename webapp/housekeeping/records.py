"""Housekeeping of records: idempotency keys past their TTL, old run records, audit events and
operations snapshots, heartbeats without a TTL."""

from __future__ import annotations

import datetime as dt

from django.conf import settings

from webapp import redis_clients
from webapp.audit.models import AuditEvent
from webapp.housekeeping.jobs import Context, delete_in_batches, job
from webapp.housekeeping.models import HousekeepingRun, OperationsSnapshot
from webapp.speech import heartbeat
from webapp.speech.models import IdempotencyKey


@job(
    "prune_records",
    "Delete idempotency keys past their TTL, old run records, audit events and operations snapshots; "
    "give TTL-less heartbeats a TTL.",
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
    # Heartbeats expire by TTL; one written without (a bug, a manual SET) would
    # show a dead worker as live forever. Give it the TTL it should have had.
    r = redis_clients.heartbeats()
    for key in r.scan_iter(match=heartbeat.KEY_PREFIX + "*", count=ctx.batch):
        if r.ttl(key) == -1:
            r.expire(key, settings.TTS_HEARTBEAT_TTL)
            ctx.add("heartbeats_given_ttl")
