"""synth.telemetry's GPU-memory readers, each in a fresh process (run by tests/gpu/engine_check.py).

``nvml``: with torch never imported, the reader takes NVML's per-process figure; it
must rise by at least 200 MiB when this process allocates 256 MiB through the CUDA
driver (libcuda, ctypes: no torch, no CUDA runtime needed). NVML matches processes by
pid, so in a container with its own pid namespace it lists other pids: then SKIP,
with the pids it listed (the torch reading is the one to use there, docs/workers.md).

``no-init``: with torch imported and CUDA not initialised (as in a worker's parent),
a reading leaves ``torch.cuda.is_initialized()`` False.

Prints one JSON line: status (PASS/FAIL/SKIP), name, detail and the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any


def _nvml_pids(index: int) -> list[int]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    pids = []
    for getter in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        pids += [int(p.pid) for p in getter(handle)]
    return sorted(set(pids))


def nvml(device: str) -> dict[str, Any]:
    name = "NVML per-process reading follows a 256 MiB allocation (torch not imported)"
    from synth import telemetry

    try:
        import pynvml  # noqa: F401
    except ImportError:
        return {"status": "FAIL", "name": name, "detail": "pynvml (nvidia-ml-py) is not importable"}
    index = telemetry.device_index(device)
    cuda = ctypes.CDLL("libcuda.so.1")

    def call(what: str, code: int) -> None:
        if code != 0:
            raise RuntimeError(f"{what} returned CUDA error {code}")

    call("cuInit", cuda.cuInit(0))
    dev = ctypes.c_int()
    call("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), index))
    ctx = ctypes.c_void_p()
    call("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    call("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
    time.sleep(0.2)
    before = telemetry.read_gpu_memory_mb(device)
    ptr = ctypes.c_uint64()
    call("cuMemAlloc_v2", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 * 2**20)))
    after = before
    for _ in range(20):  # NVML's process list may lag a little behind the allocation
        after = telemetry.read_gpu_memory_mb(device)
        if before is not None and after is not None and after - before >= 200:
            break
        time.sleep(0.1)
    pids = _nvml_pids(index)
    figures = {
        "before_mb": before,
        "after_mb": after,
        "pid": os.getpid(),
        "nvml_pids": pids,
        "torch_imported": "torch" in sys.modules,
    }
    if "torch" in sys.modules:
        return {"status": "FAIL", "name": name, "detail": "torch got imported: not the NVML path", **figures}
    if os.getpid() not in pids:
        return {
            "status": "SKIP",
            "name": name,
            "detail": f"NVML lists pids {pids}, not this process's {os.getpid()}: a pid namespace?",
            **figures,
        }
    ok = before is not None and after is not None and after - before >= 200
    detail = f"before {before} MiB, after the allocation {after} MiB"
    return {"status": "PASS" if ok else "FAIL", "name": name, "detail": detail, **figures}


def no_init(device: str) -> dict[str, Any]:
    import torch

    from synth import telemetry

    name = "a reading with torch imported never initialises CUDA"
    value = telemetry.read_gpu_memory_mb(device)
    initialised = bool(torch.cuda.is_initialized())
    detail = f"reading {value}, torch.cuda.is_initialized() {initialised}"
    if not torch.cuda.is_available():
        detail += " (no CUDA here: proves the script only)"
    return {
        "status": "FAIL" if initialised else "PASS",
        "name": name,
        "detail": detail,
        "reading_mb": value,
        "initialised": initialised,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests/gpu/readers_check.py")
    parser.add_argument("mode", choices=["nvml", "no-init"])
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    try:
        found = nvml(args.device) if args.mode == "nvml" else no_init(args.device)
    except Exception as exc:
        found = {"status": "FAIL", "name": args.mode, "detail": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(found, default=str), flush=True)
    return 0 if found["status"] != "FAIL" else 1


if __name__ == "__main__":
    raise SystemExit(main())
