"""A job's limits: a CPU-time budget that grows with its text, and a wall-clock ceiling above it."""

from __future__ import annotations

from typing import Any

from webapp.speech.services.dispatch import celery_time_limit, job_time_limits


def _limits(settings: Any, chars: int) -> tuple[float, float]:
    settings.TTS_JOB_BASE_SECONDS = 30.0
    settings.TTS_JOB_SECONDS_PER_CHAR = 0.02
    settings.TTS_MAX_JOB_SECONDS = 1800
    settings.TTS_JOB_HARD_GRACE_SECONDS = 30
    settings.TTS_JOB_WALL_FACTOR = 3.0
    return job_time_limits(chars)


def test_the_ceiling_leaves_a_busy_host_room_over_the_cpu_budget(settings: Any) -> None:
    # The job of issue 13: 3,729 characters, soft 104.58 s; before, the ceiling was 134.58 s.
    soft, hard = _limits(settings, 3729)
    assert round(soft, 2) == 104.58
    assert round(hard, 2) == round(3 * 104.58 + 30, 2)


def test_the_ceiling_is_capped_and_stays_under_celerys_limit(settings: Any) -> None:
    soft, hard = _limits(settings, 200_000)
    assert (soft, hard) == (1800.0, 1830.0)
    soft, hard = _limits(settings, 40_000)  # soft 830 s: 3 x that is over the cap
    assert (soft, hard) == (830.0, 1830.0)
    assert hard < celery_time_limit()
