"""The beat schedule runs every registered job, as a task on the housekeeping queue."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from webapp.celery import app
from webapp.housekeeping import tasks
from webapp.housekeeping.catalog import JOBS
from webapp.housekeeping.jobs import hard_time_limit, lock_ttl, soft_time_limit


def test_the_beat_schedule_contains_every_job() -> None:
    schedule: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
    entries = {e["task"]: e for e in schedule.values() if e["task"].startswith("housekeeping.")}
    assert set(entries) == {f"housekeeping.{name}" for name in JOBS}
    # Issue 13 added sweep_lost_deliveries, issue 17 snapshot_operations.
    assert (
        set(JOBS)
        == set(settings.TTS_HOUSEKEEPING_EVERY)
        == {
            "reap_stuck_jobs",
            "redispatch_jobs",
            "sweep_lost_deliveries",
            "expire_audio",
            "blank_old_texts",
            "reject_stale_voices",
            "delete_voice_files",
            "forget_one_off_voices",
            "remove_orphan_files",
            "purge_temp_files",
            "prune_records",
            "snapshot_operations",
            "evict_sentence_cache",
        }
    )
    for task, entry in entries.items():
        assert entry["schedule"] == settings.TTS_HOUSEKEEPING_EVERY[task.removeprefix("housekeeping.")]
        assert entry["options"]["queue"] == "housekeeping"
        assert 0 < entry["schedule"] <= entry["options"]["expires"]


def test_every_job_is_a_celery_task_with_a_soft_time_limit() -> None:
    app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    for name in JOBS:
        task: Any = app.tasks[f"housekeeping.{name}"]
        assert task.name == tasks.TASKS[name].name == tasks.task_name(name)
        assert task.queue == "housekeeping"
        assert task.soft_time_limit == soft_time_limit() < task.time_limit == hard_time_limit() < lock_ttl()


def test_a_task_runs_its_job(isolated: None, lock_free: None, settings: Any) -> None:
    result = tasks.TASKS["reject_stale_voices"].apply().get()
    assert result == {"skipped": False, "outcome": "ok", "counts": {}}
