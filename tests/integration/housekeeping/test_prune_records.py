"""prune_records: idempotency keys past 24 h, run records and audit events past retention,
operations snapshots past their hours, TTL-less heartbeats."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

from tests.integration.housekeeping.conftest import Clock
from tests.stack import TestStack as Stack
from webapp.audit.models import AuditEvent
from webapp.housekeeping.catalog import run_job
from webapp.housekeeping.models import HousekeepingRun, OperationsSnapshot
from webapp.speech.models import IdempotencyKey


def test_old_records_are_pruned_and_recent_ones_stay(
    clock: Clock, stack: Stack, org: Any, lock_free: None
) -> None:
    hours = dt.timedelta(hours=1)
    for i, age_hours in enumerate([25, 30, 23, 1]):
        IdempotencyKey.objects.create(
            organization=org, key=f"k{i}", request_hash="x", created_at=clock.now - age_hours * hours
        )
    retention = dt.timedelta(days=settings.TTS_AUDIT_RETENTION_DAYS)
    HousekeepingRun.objects.create(job="expire_audio", started_at=clock.now - retention - hours)
    HousekeepingRun.objects.create(job="expire_audio", started_at=clock.now - retention + hours)
    for age in (retention + hours, retention - hours):
        AuditEvent.objects.create(at=clock.now - age, actor_label="test", action=f"test.{age.days}")
    snapshot_hours = dt.timedelta(hours=settings.TTS_OPERATIONS_SNAPSHOT_HOURS)
    for age in (snapshot_hours + hours, snapshot_hours - hours):
        OperationsSnapshot.objects.create(at=clock.now - age)
    r = stack.redis_client()
    r.set("tts:heartbeat:ghost:1", '{"worker_id": "ghost:1"}')  # no TTL: would look live forever
    r.set("tts:heartbeat:live:2", '{"worker_id": "live:2"}', ex=60)
    try:
        result = run_job("prune_records", batch=1)

        assert sorted(IdempotencyKey.objects.filter(organization=org).values_list("key", flat=True)) == [
            "k2",
            "k3",
        ]
        # the old one went; the recent one and this run's own record stay
        assert HousekeepingRun.objects.count() == 2
        assert 0 < r.ttl("tts:heartbeat:ghost:1") <= settings.TTS_HEARTBEAT_TTL
        assert r.ttl("tts:heartbeat:live:2") > settings.TTS_HEARTBEAT_TTL
        assert AuditEvent.objects.filter(action__startswith="test.").count() == 1
        assert OperationsSnapshot.objects.count() == 1
        assert result.counts == {
            "idempotency_keys": 2,
            "run_records": 1,
            "audit_events": 1,
            "operations_snapshots": 1,
            "heartbeats_given_ttl": 1,
        }
        assert run_job("prune_records").counts == {
            "idempotency_keys": 0,
            "run_records": 0,
            "audit_events": 0,
            "operations_snapshots": 0,
        }
    finally:
        r.delete("tts:heartbeat:ghost:1", "tts:heartbeat:live:2")
