"""What the housekeeping jobs did (one row per run, pruned after TTS_AUDIT_RETENTION_DAYS) and the operations snapshots."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class HousekeepingRun(models.Model):
    """One run of one housekeeping job (skipped runs, which did nothing, leave no row)."""

    class Outcome(models.TextChoices):
        OK = "ok"
        # Stopped at its time budget with work left; the next run continues.
        PARTIAL = "partial"
        ERROR = "error"

    job = models.CharField(max_length=50)
    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.OK)
    counts = models.JSONField(default=dict)
    error = models.CharField(max_length=1000, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "-started_at"]),
            models.Index(fields=["started_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.job} at {self.started_at:%Y-%m-%d %H:%M:%S} ({self.outcome})"


class OperationsSnapshot(models.Model):
    """The operations page's figures at one minute (webapp/speech/operations.py), for its 24-hour charts.

    Written by the ``snapshot_operations`` job every minute; ``prune_records``
    deletes rows older than TTS_OPERATIONS_SNAPSHOT_HOURS. ``at`` is the
    minute (seconds zero) and unique: however many runs a minute sees (two
    beats, a run by hand), the first one's row is the minute's.
    """

    at = models.DateTimeField(default=timezone.now, unique=True)
    data = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"operations at {self.at:%Y-%m-%d %H:%M}"
