"""The recycle decision, the backoff schedule and the error mapping, without processes."""

from __future__ import annotations

import errno

import pytest

from webapp.speech.runtime import recycling
from webapp.speech.runtime.attempt import is_out_of_memory, storage_error_code
from webapp.speech.runtime.recycling import ChildHealth, RecyclePolicy, RtfTracker, backoff_delay, reason_kind


def test_rss_over_limit_recycles() -> None:
    health = ChildHealth(RecyclePolicy(max_rss_mb=500))
    assert health.check(rss_mb=400) is None
    reason = health.check(rss_mb=600)
    assert reason is not None and reason_kind(reason) == "rss"
    # The decision sticks: the child leaves even if the next reading is lower.
    assert health.check(rss_mb=100) == reason


def test_gpu_memory_path_uses_the_injected_reader() -> None:
    readings = iter([800.0, 1200.0])
    health = ChildHealth(RecyclePolicy(max_gpu_mb=1000), gpu_reader=lambda: next(readings))
    assert health.check(rss_mb=100) is None
    assert health.last_gpu_mb == 800.0
    reason = health.check(rss_mb=100)
    assert reason is not None and reason.startswith("gpu_memory 1200")


def test_gpu_reader_failure_never_breaks_the_check() -> None:
    def broken() -> float:
        raise RuntimeError("NVML went away")

    health = ChildHealth(RecyclePolicy(max_gpu_mb=1), gpu_reader=broken)
    assert health.check(rss_mb=100) is None
    assert health.last_gpu_mb is None


def test_no_gpu_limit_means_no_gpu_recycle() -> None:
    health = ChildHealth(RecyclePolicy(max_gpu_mb=0), gpu_reader=lambda: 10_000.0)
    assert health.check(rss_mb=100) is None


def test_age_limit() -> None:
    health = ChildHealth(RecyclePolicy(max_age_seconds=60), started_at=1000.0)
    assert health.check(now=1059.0, rss_mb=1) is None
    reason = health.check(now=1061.0, rss_mb=1)
    assert reason is not None and reason_kind(reason) == "age"


def test_rtf_drift_against_own_baseline_per_engine() -> None:
    tracker = RtfTracker(baseline_tasks=3, window=4)
    for rtf in (0.05, 0.06, 0.05):
        tracker.add("piper", rtf)
    assert tracker.baselines["piper"] == pytest.approx(0.05)
    # Another engine's very different RTF is not a drift of piper.
    for _ in range(10):
        tracker.add("espeak", 0.5)
    for rtf in (0.09, 0.09, 0.09, 0.09):
        tracker.add("piper", rtf)
    assert tracker.drifted(2.0) is None  # 1.8x: under the factor
    for rtf in (0.2, 0.2, 0.2):
        tracker.add("piper", rtf)
    assert tracker.drifted(2.0) == "piper"  # median of the window 0.2 > 2 x 0.05
    assert tracker.drifted(0) is None  # factor 0 switches the check off


def test_rtf_drift_needs_a_full_window() -> None:
    health = ChildHealth(RecyclePolicy(rtf_drift_factor=2.0, rtf_baseline_tasks=2, rtf_window=3))
    for rtf in (0.01, 0.01, 0.1, 0.1):
        health.rtf.add("espeak", rtf)
    assert health.check(rss_mb=1) is None  # two slow samples are not a trend yet
    health.rtf.add("espeak", 0.1)
    reason = health.check(rss_mb=1)
    assert reason is not None and reason_kind(reason) == "rtf_drift"


def test_backoff_grows_and_is_capped() -> None:
    delays = [backoff_delay(n, 2.0, 60.0) for n in range(0, 8)]
    assert delays == [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_gpu_reader_on_cpu_reads_nothing() -> None:
    assert recycling.read_gpu_memory_mb("cpu") is None


def test_configured_reader_is_loaded_by_dotted_path() -> None:
    from tests.reliability import fakes

    assert recycling.load_gpu_reader("tests.reliability.fakes:gpu_mb_from_file") is fakes.gpu_mb_from_file
    assert (
        recycling.load_gpu_reader("webapp.speech.runtime.recycling.read_gpu_memory_mb")
        is recycling.read_gpu_memory_mb
    )


def test_out_of_memory_and_storage_errors_are_classified() -> None:
    class OutOfMemoryError(RuntimeError):  # the name torch.cuda uses
        pass

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(
        RuntimeError("[ONNXRuntimeError] : 6 : Failed to allocate memory for requested buffer")
    )
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert storage_error_code(OSError(errno.ENOSPC, "No space left on device")) == "disk_full"
    assert storage_error_code(OSError(errno.EACCES, "Permission denied")) == "storage_error"
    assert storage_error_code(ValueError("not storage")) is None


def test_exit_hook_reports_over_limit_only_once_requested() -> None:
    import billiard.pool as pool

    original = pool.mem_rss  # type: ignore[attr-defined]  # billiard-stubs omit pool.mem_rss (present at runtime)
    try:
        assert recycling.install_exit_hook()
        assert pool.mem_rss() < 2**40  # type: ignore[attr-defined]  # a real reading while nothing is requested
        recycling._exit_requested.append("test")
        assert pool.mem_rss() >= 2**62  # type: ignore[attr-defined]
    finally:
        recycling._exit_requested.clear()
        pool.mem_rss = original  # type: ignore[attr-defined]


# ------------------------------------------------------------------ baselines, jitter, the loop guard


def test_a_child_born_over_the_memory_limit_does_not_recycle_after_every_task() -> None:
    health = ChildHealth(RecyclePolicy(max_rss_mb=500, max_gpu_mb=1000), gpu_reader=lambda: 1200.0)
    health.set_baseline(rss_mb=650)  # over both limits right after warm-up
    for n in range(1, 40):
        assert health.check(rss_mb=650 + n, tasks_done=n) is None
    # Grown 10 % over its own baseline: now a fresh child would be smaller, so it goes.
    reason = health.check(rss_mb=720, tasks_done=40)
    assert reason == "rss 720 MiB over 500 MiB (baseline 650 MiB after warm-up)"


def test_the_gpu_limit_also_counts_from_the_baseline() -> None:
    readings = iter([900.0, 950.0, 1150.0])
    health = ChildHealth(RecyclePolicy(max_gpu_mb=1000), gpu_reader=lambda: next(readings))
    health.set_baseline(rss_mb=100)  # baseline GPU reading 900
    assert health.check(rss_mb=100) is None  # 950: under the limit
    reason = health.check(rss_mb=100)
    assert reason is not None and reason.startswith("gpu_memory 1150 MiB over 1000 MiB")


def test_a_recycle_before_the_minimum_task_count_is_held_back_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = ChildHealth(RecyclePolicy(max_age_seconds=10, min_tasks=5, age_jitter=0.15), started_at=1000.0)
    limit = health.max_age_seconds
    with caplog.at_level("ERROR", logger="webapp.speech.runtime.recycling"):
        for n in (1, 2, 3, 4):
            assert health.check(now=1000.0 + limit + n, rss_mb=1, tasks_done=n) is None
    assert reason_kind(health.held_back) == "age"
    assert len([r for r in caplog.records if "would be recycled after only 1 tasks" in r.message]) == 1
    reason = health.check(now=1000.0 + limit + 5, rss_mb=1, tasks_done=5)
    assert reason is not None and reason_kind(reason) == "age"


def test_age_limits_are_jittered_within_15_percent_per_child() -> None:
    policy = RecyclePolicy(max_age_seconds=3600, age_jitter=recycling.AGE_JITTER)
    limits = [ChildHealth(policy).max_age_seconds for _ in range(200)]
    assert all(0.85 * 3600 <= x <= 1.15 * 3600 for x in limits)
    # Children started together: their deadlines spread over most of the +-15 % band.
    assert max(limits) - min(limits) > 0.2 * 3600
    assert ChildHealth(RecyclePolicy(max_age_seconds=0)).age_deadline is None


def test_drift_is_measured_per_character_so_short_jobs_are_not_drift() -> None:
    tracker = RtfTracker(baseline_tasks=3, window=4)
    for _ in range(3):
        tracker.add("piper", 0.001, 1000)  # long jobs: 1 ms of synthesis per character
    # A window of short jobs, whose fixed costs make each slow per character, and one long job:
    # per job the median is 5 ms/char (5 x the baseline); per character it is still 1 ms.
    for seconds_per_char, chars in ((0.005, 10), (0.005, 10), (0.005, 10), (0.001, 1000)):
        tracker.add("piper", seconds_per_char, chars)
    assert tracker.drifted(2.0) is None
    for _ in range(4):
        tracker.add("piper", 0.003, 1000)  # the long jobs themselves got 3 x slower
    assert tracker.drifted(2.0) == "piper"
    assert tracker.rolling("piper") == pytest.approx(0.003)


def test_task_count_limits_are_drawn_per_child_at_or_below_the_setting() -> None:
    policy = RecyclePolicy(max_tasks=200, task_jitter=recycling.TASK_JITTER)
    limits = [ChildHealth(policy).max_tasks for _ in range(200)]
    # Never above the setting (billiard's own limit), never more than 15 % below it.
    assert all(170 <= x <= 200 for x in limits)
    # Children that share jobs evenly reach one count together: their limits must differ.
    assert len(set(limits)) > 20
    assert ChildHealth(RecyclePolicy(max_tasks=0, task_jitter=0.15)).max_tasks == 0
    assert ChildHealth(RecyclePolicy(max_tasks=1, task_jitter=0.15)).max_tasks == 1
