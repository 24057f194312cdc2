"""The one GPU-memory reader (synth.telemetry), with injected torch and NVML readings (CI has no GPU)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from synth import telemetry

MIB = 2**20


class FakeCuda:
    """torch.cuda as far as the reader uses it: a caching allocator's current and peak reservation."""

    def __init__(self, reserved_mb: float, peak_mb: float, initialized: bool = True) -> None:
        self.reserved, self.peak, self.initialized = reserved_mb * MIB, peak_mb * MIB, initialized
        self.indexes: list[int] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def memory_reserved(self, index: int) -> float:
        self.indexes.append(index)
        return self.reserved

    def max_memory_reserved(self, index: int) -> float:
        self.indexes.append(index)
        return self.peak

    def reset_peak_memory_stats(self, index: int) -> None:
        self.peak = self.reserved


class FakeNvml:
    """pynvml's process lists: (pid, bytes) per compute and graphics context."""

    def __init__(self, compute: list[tuple[int, int | None]], graphics: list[tuple[int, int | None]]) -> None:
        self.compute, self.graphics = compute, graphics
        self.handles: list[int] = []

    def nvmlInit(self) -> None:  # pynvml's names
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.handles.append(index)
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.graphics]


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)


def test_cpu_reads_nothing() -> None:
    assert telemetry.read_gpu_memory_mb("cpu") is None
    assert telemetry.read_gpu_memory_mb("cpu", peak=True) is None
    assert telemetry.default_gpu_reader("cpu") is None


def test_torch_answers_current_and_peak_on_the_right_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(reserved_mb=300, peak_mb=900)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    assert telemetry.read_gpu_memory_mb("cuda:1") == 300.0  # what the child holds now (recycling)
    assert telemetry.read_gpu_memory_mb("cuda:1", peak=True) == 900.0  # a job's peak (metrics)
    assert telemetry.default_gpu_reader("cuda:1") == 900.0
    assert cuda.indexes == [1, 1, 1]
    telemetry.reset_gpu_peak("cuda:1")
    assert telemetry.read_gpu_memory_mb("cuda", peak=True) == 300.0  # a new job starts a new peak
    assert cuda.indexes[-1] == 0


def test_torch_without_a_cuda_context_falls_back_to_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading must never initialise CUDA: torch imported but not initialised is not asked.
    cuda = FakeCuda(reserved_mb=300, peak_mb=900, initialized=False)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    nvml = FakeNvml(compute=[(4242, 100 * MIB)], graphics=[])
    monkeypatch.setattr(telemetry, "_nvml", lambda: nvml)
    assert telemetry.read_gpu_memory_mb("cuda:0", pid=4242) == 100.0
    assert cuda.indexes == []


def test_nvml_counts_compute_and_graphics_contexts_of_this_process_only() -> None:
    nvml = FakeNvml(
        compute=[(10, 200 * MIB), (11, 5000 * MIB), (10, None)],
        graphics=[(10, 56 * MIB), (12, 7000 * MIB)],
    )
    assert telemetry.nvml_process_mb(3, 10, nvml) == 256.0
    assert nvml.handles == [3]
    assert telemetry.nvml_process_mb(3, 99, nvml) == 0.0  # no context on that GPU: nothing held
    assert telemetry.nvml_process_mb(0, 10, None) is None  # no pynvml: cannot tell


def test_an_nvml_failure_reads_unknown(no_torch: None) -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:  # pynvml's names
            raise RuntimeError("NVML Shared Library Not Found")

    assert telemetry.nvml_process_mb(0, 1, Broken([], [])) is None


def test_peak_memory_reports_the_peak_of_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(reserved_mb=300, peak_mb=5000)  # a peak left over from an earlier job
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    with telemetry.PeakMemory("cuda:0") as mem:
        cuda.reserved = 700 * MIB
        cuda.peak = max(cuda.peak, cuda.reserved)
        cuda.reserved = 400 * MIB
    assert mem.peak_gpu_mb == 700.0


def test_the_worker_reads_the_current_figure_on_its_configured_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("django")
    from django.conf import settings

    from webapp.speech.runtime import recycling

    cuda = FakeCuda(reserved_mb=300, peak_mb=900)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(settings, "TTS_WORKER_DEVICE", "cuda:2")
    assert recycling.read_gpu_memory_mb() == 300.0
    assert cuda.indexes == [2]
    assert recycling.read_gpu_memory_mb("cpu") is None
