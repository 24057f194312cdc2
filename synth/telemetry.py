"""Memory readings for one synthesis call: peak RSS and peak GPU memory.

Peak RSS: a background thread samples psutil every few milliseconds; the
kernel's ``ru_maxrss`` catches a peak the sampler missed (it only counts when
it rose during the call, as it is a lifetime maximum). GPU memory: torch's
``max_memory_reserved`` when torch is already imported and has CUDA, else
NVML per-process usage when ``pynvml`` imports, else None (CPU). The GPU
reader is injectable (``gpu_reader=`` or the module attribute ``gpu_reader``)
so callers can test with a fake reading.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Callable
from types import TracebackType

GpuReader = Callable[[str], "float | None"]


def read_rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / (1024 * 1024)


def _maxrss_mb() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0  # KiB on Linux


def default_gpu_reader(device: str) -> float | None:
    """Peak GPU memory (MiB) of this process on ``device``, or None on CPU / when unknown."""
    if not device.startswith("cuda"):
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                return float(torch.cuda.max_memory_reserved(index)) / (1024 * 1024)
        except Exception:  # noqa: S110 - fall through to NVML
            pass
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pid = os.getpid()
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return float(proc.usedGpuMemory) / (1024 * 1024)
        return 0.0
    except Exception:
        return None


gpu_reader: GpuReader = default_gpu_reader


class PeakMemory:
    """Context manager measuring peak RSS (and GPU memory) while it is open."""

    def __init__(
        self, device: str = "cpu", interval: float = 0.01, gpu_reader: GpuReader | None = None
    ) -> None:
        self.device = device
        self.interval = interval
        self._gpu_reader = gpu_reader
        self.peak_rss_mb = 0.0
        self.peak_gpu_mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maxrss_before = 0.0

    def _sample(self) -> None:
        rss = read_rss_mb()
        if rss > self.peak_rss_mb:
            self.peak_rss_mb = rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._maxrss_before = _maxrss_mb()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="synth-peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        after = _maxrss_mb()
        if after > self._maxrss_before and after > self.peak_rss_mb:
            self.peak_rss_mb = after
        reader = self._gpu_reader or gpu_reader
        try:
            self.peak_gpu_mb = reader(self.device)
        except Exception:
            self.peak_gpu_mb = None


__all__ = ["PeakMemory", "default_gpu_reader", "gpu_reader", "read_rss_mb"]
