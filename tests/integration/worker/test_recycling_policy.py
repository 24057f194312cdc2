"""The recycle decision, the backoff schedule and the error mapping, without processes."""

from __future__ import annotations

import errno

import pytest

from webapp.speech import recycling
from webapp.speech.recycling import ChildHealth, RecyclePolicy, RtfTracker, backoff_delay, reason_kind
from webapp.speech.tasks import is_out_of_memory, storage_error_code


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
        recycling.load_gpu_reader("webapp.speech.recycling.read_gpu_memory_mb")
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

    original = pool.mem_rss
    try:
        assert recycling.install_exit_hook()
        assert pool.mem_rss() < 2**40  # a real reading while nothing is requested
        recycling._exit_requested.append("test")
        assert pool.mem_rss() >= 2**62
    finally:
        recycling._exit_requested.clear()
        pool.mem_rss = original
