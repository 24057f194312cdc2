"""prune_records: idempotency keys past 24 h, run records and audit events past retention,
operations snapshots past their hours, TTL-less heartbeats."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

from tests.integration.housekeeping.conftest import Clock
from tests.stack import TestStack as Stack
from webapp.audit.models import AuditEvent
from webapp.dictionaries.models import Dictionary, DictionaryVersion
from webapp.housekeeping.catalog import run_job
from webapp.housekeeping.models import HousekeepingRun, OperationsSnapshot
from webapp.speech.models import IdempotencyKey, JobTimestamps, SynthesisJob
from webapp.webhooks.models import WebhookAttempt, WebhookMessage


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
            "webhook_messages_and_attempts": 0,
            "dictionary_pins": 0,
            "orphan_timestamps": 0,
            "heartbeats_given_ttl": 1,
        }
        assert run_job("prune_records").counts == {
            "idempotency_keys": 0,
            "run_records": 0,
            "audit_events": 0,
            "operations_snapshots": 0,
            "webhook_messages_and_attempts": 0,
            "dictionary_pins": 0,
            "orphan_timestamps": 0,
        }
    finally:
        r.delete("tts:heartbeat:ghost:1", "tts:heartbeat:live:2")


def _job(org: Any, status: str, **fields: Any) -> SynthesisJob:
    return SynthesisJob.objects.create(
        organization=org,
        voice_name="v",
        engine="espeak",
        text="x",
        text_chars=1,
        format="wav",
        status=status,
        **fields,
    )


def test_webhook_messages_pins_and_orphan_timestamps_are_pruned_past_their_retention(
    clock: Clock, org: Any, lock_free: None
) -> None:
    """Each grew by a row an event or a job, for good."""
    day = dt.timedelta(days=1)
    old = clock.now - dt.timedelta(days=settings.TTS_WEBHOOK_RETENTION_DAYS) - day
    messages = {}
    for name, status, created in [
        ("old-delivered", "delivered", old),
        ("old-failed", "failed", old),
        ("old-pending", "pending", old),  # still being tried: kept whatever its age
        ("new-delivered", "delivered", clock.now - day),
    ]:
        messages[name] = WebhookMessage.objects.create(
            organization=org,
            url="https://hooks.example/x",
            event="job.succeeded",
            payload={},
            dedupe_key=name,
            status=status,
            created_at=created,
        )
        WebhookAttempt.objects.create(message=messages[name], started_at=created, status_code=500)

    dictionary = Dictionary.objects.create(organization=org, name="names", latest_version=1)
    version = DictionaryVersion.objects.create(dictionary=dictionary, number=1)
    hours = dt.timedelta(hours=settings.TTS_DICTIONARY_PIN_RETENTION_HOURS)
    long_done = _job(org, "succeeded", finished_at=clock.now - hours - day, audio_bytes=100)
    just_done = _job(org, "failed", finished_at=clock.now - hours / 2)
    running = _job(org, "running")
    for job in (long_done, just_done, running):
        job.pinned_dictionary_versions.add(version)

    expired = _job(org, "expired", finished_at=clock.now - day)  # its audio went, its timestamps stayed
    for job in (long_done, expired):
        JobTimestamps.objects.create(job=job, words=[{"text": "x"}])

    result = run_job("prune_records", batch=2)

    assert sorted(WebhookMessage.objects.filter(organization=org).values_list("dedupe_key", flat=True)) == [
        "new-delivered",
        "old-pending",
    ]
    assert WebhookAttempt.objects.filter(message__organization=org).count() == 2  # theirs
    assert result.counts["webhook_messages_and_attempts"] == 4  # two messages, an attempt each
    assert sorted(version.pinning_jobs.values_list("id", flat=True)) == sorted([just_done.id, running.id])
    assert result.counts["dictionary_pins"] == 1
    assert list(JobTimestamps.objects.filter(job__organization=org).values_list("job_id", flat=True)) == [
        long_done.id
    ]
    assert result.counts["orphan_timestamps"] == 1
