"""Memory readings: peak RSS and GPU memory for one synthesis call, current GPU memory for a worker.

Peak RSS: a background thread samples the resident set every few milliseconds; the
kernel's ``ru_maxrss`` catches a peak the sampler missed (it only counts when
it rose during the call, as it is a lifetime maximum).

GPU memory has one reader, :func:`read_gpu_memory_mb`, for both questions the
service asks: the peak of one job (``peak=True``, reported in the job's
metrics) and what a worker child holds now (``peak=False``, checked against
the recycle limit). torch's caching allocator answers when torch is already
imported with CUDA initialised (``max_memory_reserved`` / ``memory_reserved``;
reading never initialises CUDA); otherwise NVML's per-process usage, compute
and graphics contexts together (onnxruntime's CUDA provider shows up there;
NVML keeps no peak, so both questions get the current figure); otherwise None
(CPU, or nothing can tell). The peak reader used by :class:`PeakMemory` is
injectable (``gpu_reader=`` or the module attribute ``gpu_reader``) so callers
can test with a fake reading.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

GpuReader = Callable[[str], "float | None"]


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_rss_mb() -> float:
    """This process's resident set, in MiB.

    The peak sampler calls this a hundred times a second for the whole of every job: on Linux it
    reads /proc/self/statm (a few microseconds), where psutil.Process() re-reads the process's
    identity each time (about a hundred, ~1 % of a worker child's CPU under load).
    """
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES / (1024 * 1024)
    except (OSError, IndexError, ValueError):
        import psutil

        return float(psutil.Process().memory_info().rss) / (1024 * 1024)


def _maxrss_mb() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0  # KiB on Linux


def device_index(device: str) -> int:
    """``"cuda:1"`` -> 1; ``"cuda"`` -> 0."""
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0


def read_gpu_memory_mb(device: str, peak: bool = False, pid: int | None = None) -> float | None:
    """GPU memory (MiB) of this process on ``device``: the peak since the last reset, or now.

    None on CPU and when nothing can tell (no torch with CUDA, no NVML).
    """
    if not device.startswith("cuda"):
        return None
    index = device_index(device)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                reserved = torch.cuda.max_memory_reserved if peak else torch.cuda.memory_reserved
                return float(reserved(index)) / 2**20
        except Exception:  # noqa: S110 - a broken CUDA runtime: try NVML
            pass
    return nvml_process_mb(index, os.getpid() if pid is None else pid, _nvml())


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def nvml_process_mb(index: int, pid: int, nvml: Any) -> float | None:
    """What ``pid`` holds on GPU ``index`` by NVML's process lists (compute and graphics), or None.

    ``nvml`` is the ``pynvml`` module (None when it is not installed); tests pass a stand-in.
    """
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        used = 0.0
        for getter in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            for proc in getter(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    used += float(proc.usedGpuMemory) / 2**20
        # Not listed: this process holds no context on that GPU (yet), which is 0, not unknown.
        return used
    except Exception:
        return None


def reset_gpu_peak(device: str) -> None:
    """Start a new peak for :func:`read_gpu_memory_mb` (torch only; NVML keeps no peak)."""
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda"):
        return
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats(device_index(device))
    except Exception:  # noqa: S110 - a reading is never worth failing a job for
        pass


def default_gpu_reader(device: str) -> float | None:
    """Peak GPU memory (MiB) of this process on ``device`` since :func:`reset_gpu_peak`, or None."""
    return read_gpu_memory_mb(device, peak=True)


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
        reset_gpu_peak(self.device)  # the peak of this call, not of the process's life
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


__all__ = [
    "PeakMemory",
    "default_gpu_reader",
    "device_index",
    "gpu_reader",
    "nvml_process_mb",
    "read_gpu_memory_mb",
    "read_rss_mb",
    "reset_gpu_peak",
]
