"""The PyTorch Piper engine on one device: parity, throughput, peak memory per job.

Run by tests/gpu/check.sh (``--device cpu`` in ``make test``; a CUDA device on a
GPU machine). Reads only prepared files (tests/gpu/prepare.py): the fp16
inference weights the engine's loader extracted, phoneme ids, piper's model
code. Without ``--prepared`` it prepares them into a temporary folder first
(this needs the project's venv: piper-tts, onnx, the voice package).

Prints one PASS/FAIL/SKIP line per check and the figures; exits 1 on a FAIL.
Tolerances: the fp32 run's integer durations equal onnxruntime's (the weights
went through fp16, so at most one phoneme may land one frame apart); fp16 on
CUDA against fp32 given the same durations: max abs difference < 0.05 and
signal-to-difference ratio >= 20 dB, and the loudness envelope (10 ms RMS)
correlates >= 0.98 (an intelligibility proxy: no speech recogniser runs here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOP = 256


def _setup(prepared: Path) -> None:
    for path in (str(ROOT), str(prepared / "pysrc")):
        if path not in sys.path:
            sys.path.insert(0, path)


def _ensure_prepared(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    sys.path.insert(0, str(ROOT))
    from tests.gpu.prepare import prepare

    out = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    prepare(out)
    return out


def _report(status: str, name: str, detail: str = "") -> bool:
    print(f"{status}: {name}" + (f" ({detail})" if detail else ""), flush=True)
    return status != "FAIL"


def _run(vt: Any, model: Any, ids: list[list[int]], device: str, dtype: Any, **kw: Any) -> list[Any]:
    import torch

    with torch.inference_mode():
        out = vt.infer(
            model,
            [
                vt.Utterance(
                    row,
                    kw.get("noise", 0.0),
                    1.0,
                    kw.get("noise", 0.0),
                    durations=(kw.get("durations") or [None] * len(ids))[i],
                )
                for i, row in enumerate(ids)
            ],
            device,
            dtype,
        )
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return list(out)


def check_durations(vt: Any, model: Any, data: dict[str, Any], device: str) -> tuple[bool, list[list[int]]]:
    import torch

    reference = data["onnxruntime_durations"]
    ids = data["phoneme_ids"][: len(reference)]
    outs = _run(vt, model, ids, device, torch.float32)
    off = sum(
        a != b for o, ref in zip(outs, reference, strict=True) for a, b in zip(o.durations, ref, strict=True)
    )
    worst = max(
        abs(a - b)
        for o, ref in zip(outs, reference, strict=True)
        for a, b in zip(o.durations, ref, strict=True)
    )
    ok = off <= 1 and worst <= 1
    _report(
        "PASS" if ok else "FAIL",
        "fp32 durations match onnxruntime",
        f"{off} phoneme(s) differ, by at most {worst} frame",
    )
    return ok, [o.durations for o in outs]


def _envelope(audio: Any, rate: int) -> Any:
    import numpy as np

    step = rate // 100
    n = audio.size // step
    return np.sqrt(np.mean(np.square(audio[: n * step].reshape(n, step)), axis=1))


def check_fp16(vt: Any, model: Any, data: dict[str, Any], device: str) -> bool:
    import numpy as np
    import torch

    if not device.startswith("cuda"):
        return _report("SKIP", "fp16 vs fp32 parity", "fp16 runs on CUDA only")
    ids = data["phoneme_ids"][:4]
    full = _run(vt, model, ids, device, torch.float32)
    durations = [o.durations for o in full]
    vt.place(model, device, torch.float16)
    half = _run(vt, model, ids, device, torch.float16, durations=durations)
    free_durations = _run(vt, model, ids, device, torch.float16)
    vt.place(model, device, torch.float32)
    worst, snr, corr = 0.0, math.inf, 1.0
    for a, b in zip(full, half, strict=True):
        diff = a.audio - b.audio
        worst = max(worst, float(np.max(np.abs(diff))))
        snr = min(snr, 10 * math.log10(float(np.sum(a.audio**2)) / max(float(np.sum(diff**2)), 1e-20)))
        corr = min(
            corr,
            float(
                np.corrcoef(_envelope(a.audio, data["sample_rate"]), _envelope(b.audio, data["sample_rate"]))[
                    0, 1
                ]
            ),
        )
    same = sum(a.durations == b.durations for a, b in zip(full, free_durations, strict=True))
    ok = worst < 0.05 and snr >= 20 and corr >= 0.98
    detail = f"max abs diff {worst:.4f}, SNR {snr:.1f} dB, envelope corr {corr:.4f}; fp16 picks the same durations in {same}/{len(ids)}"
    return _report("PASS" if ok else "FAIL", "fp16 vs fp32 parity (same durations)", detail)


def _peak_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return float(torch.cuda.max_memory_allocated(device)) / 2**20
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def throughput(
    vt: Any, model: Any, data: dict[str, Any], device: str, dtype: Any, sizes: list[int], copies: int
) -> dict[int, tuple[float, float]]:
    """audio-seconds per wall-second and peak MiB per job, for each batch size."""
    import torch

    ids = data["phoneme_ids"] * copies
    rate = data["sample_rate"]
    _run(vt, model, ids[:2], device, dtype)  # warm-up (kernels, allocator)
    figures = {}
    for size in sizes:
        audio = 0.0
        peaks = []
        started = time.perf_counter()
        for start in range(0, len(ids), size):
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats(device)
            outs = _run(vt, model, ids[start : start + size], device, dtype, noise=0.667)
            audio += sum(o.audio.size for o in outs) / rate
            # CUDA: this batch's own peak shared by its jobs; CPU: the process's peak RSS so far.
            peaks.append(_peak_mb(device) / (len(outs) if device.startswith("cuda") else 1))
        wall = time.perf_counter() - started
        figures[size] = (audio / wall, max(peaks))
        print(
            f"  batch {size:>2}: {audio / wall:8.1f} audio-s per wall-s, peak {max(peaks):8.1f} MiB per job"
            f" ({'max_memory_allocated' if device.startswith('cuda') else 'process peak RSS'})",
            flush=True,
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests/gpu/engine_check.py")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--prepared", default=None, help="folder from `make gpu-check-prepare`")
    args = parser.parse_args()
    prepared = _ensure_prepared(args.prepared)
    if not args.prepared:  # ours: 30 MiB of weights not to leave behind
        import atexit
        import shutil

        atexit.register(shutil.rmtree, prepared, True)
    _setup(prepared)
    import torch

    from synth.engines import vits_torch as vt

    cpu = args.device == "cpu"
    if cpu:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    data = json.loads((prepared / "utterances.json").read_text(encoding="utf-8"))
    started = time.perf_counter()
    model, _ = vt.load_prepared(str(prepared / "weights.pt"))
    vt.place(model, args.device, torch.float32)
    ok = _report(
        "PASS",
        "weights load from the prepared fp16 file",
        f"{time.perf_counter() - started:.1f} s, torch {torch.__version__}",
    )
    good, _ = check_durations(vt, model, data, args.device)
    ok &= good
    ok &= check_fp16(vt, model, data, args.device)
    dtype = torch.float32 if cpu else torch.float16
    if not cpu:
        vt.place(model, args.device, dtype)
    if cpu:  # proves the script in `make test`: the four shortest sentences, batch 1 and 4
        data["phoneme_ids"] = sorted(data["phoneme_ids"], key=len)[:4]
    sizes, copies = ([1, 4], 1) if cpu else ([1, 8, 32], 8)
    count = len(data["phoneme_ids"]) * copies
    print(f"throughput on {args.device} ({str(dtype).replace('torch.', '')}, {count} sentences):")
    figures = throughput(vt, model, data, args.device, dtype, sizes, copies)
    batched = 4 if cpu else 8
    ratio = figures[batched][0] / figures[1][0]
    ok &= _report("PASS", "batched throughput measured", f"batch {batched} / batch 1 = {ratio:.2f}")
    print(
        json.dumps(
            {
                "device": args.device,
                "throughput": {k: round(v[0], 1) for k, v in figures.items()},
                "peak_mb_per_job": {k: round(v[1], 1) for k, v in figures.items()},
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
