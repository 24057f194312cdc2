"""The PyTorch Piper engine on one device, engine level only: parity, throughput, GPU memory.

Run by tests/gpu/check.sh (``--device cpu`` in ``make test``; ``cuda:N`` on a GPU
machine). Imports torch, numpy, synth (the engine's model code and its memory
readers) and piper's model code from the prepared folder; nothing of webapp (no
Django, Celery, Redis or PostgreSQL). Reads only prepared files
(tests/gpu/prepare.py); without ``--prepared`` it prepares them into a temporary
folder first (this needs the project's venv: piper-tts, onnx, onnxruntime, the voice).

Sections, each printed as PASS/FAIL/SKIP lines and written to ``--out``/results.json
as it ends (a run cut short leaves what it measured):

1. environment: Python, torch, CUDA, the GPU, and what made the references.
2. load: the prepared fp16 weights load.
3. torch vs onnxruntime, noise off: durations (free run) and waveform (with
   onnxruntime's durations) against onnxruntime's, computed on the CPU machine by
   ``make gpu-check-prepare`` with the same fp16-rounded weights (no onnxruntime
   here). Float32 (exact float32 on CUDA: TF32 off) and, on CUDA, fp16. The prepare
   machine's own torch-vs-onnxruntime figures are given as the baseline, and what the
   weights' rounding alone does to onnxruntime's output.
4. fp16 on CUDA vs float32 on CPU, same text and seed (noise on): the CPU float32
   reference was computed by prepare from the same fp16-rounded weights; durations
   of a free run, waveform with the reference's durations. Float32 on CUDA too, to
   tell CUDA's kernels from fp16. On the CPU: float32 against it (same machine kind:
   a check of the script).
5. memory readers (separate processes): NVML's per-process reading follows a 256 MiB
   allocation made without torch; reading with torch imported never initialises CUDA.
6. GPU memory in one process: synth.telemetry's reading (torch's memory_reserved),
   memory_allocated and NVML's figure after a warm-up and after 200 more sentences in
   mixed batches of 1-8 (what a batching worker child runs), sampled after each batch:
   whether it creeps (FAIL: memory_allocated grows by over 1 MiB, a leak, or
   memory_reserved grows by over 20 MiB in the second half). The worker's recycle decision on that reading (webapp) is not run
   here: the CPU tests cover it (tests/reliability/test_recycling.py, tests/unit).
7. throughput at batch 1, 8 and 32 (fp16 on CUDA, the GPU workers' dtype): audio
   seconds per wall second, the aggregate RTF, per-job RTF (a job waits for its whole
   pass), peak memory per pass, beside CosyVoice2's published TensorRT-LLM RTF.
8. VoxCPM (tests/gpu/voxcpm_check.py, last, key ``voxcpm``): a tiny random-weight
   VoxCPM2 through the service's engine (synth.engines.voxcpm); memory after load, after
   each of 20 jobs, after a recycle (the engine dropped and loaded again) and in a fresh
   process; memory and leak figures only. SKIP where voxcpm is not installed.

Tolerances: durations within one frame, at most 2 % of phonemes off; waveforms by
signal-to-difference ratio (SNR) and the correlation of the 10 ms loudness envelopes
(an intelligibility proxy: no speech recogniser runs here): float32 >= 40 dB, fp16
>= 20 dB, envelopes >= 0.98 (fp16) / 0.99 (float32). The CPU run (``make test``) runs
every section on small workloads; its figures prove the script, not the device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The figures the issue compares with: CosyVoice2 served with TensorRT-LLM (runtime/triton_trtllm
# in FunAudioLLM/CosyVoice), RTF at 1 and 16 concurrent requests, as quoted in the issue.
COSYVOICE2_TRTLLM = {"rtf_at_batch": {"1": 0.099, "16": 0.039}, "source": "as quoted in the GPU-check issue"}
SNR_FP32_DB, SNR_FP16_DB = 40.0, 20.0
ENVELOPE_FP32, ENVELOPE_FP16 = 0.99, 0.98
CREEP_MB = 20.0  # reserved growth over the second half of the memory run that counts as creep


# --------------------------------------------------------------------------- figures


def envelope(audio: Any, rate: int) -> Any:
    """Loudness envelope: RMS per 10 ms."""
    import numpy as np

    step = rate // 100
    n = audio.size // step
    return np.sqrt(np.mean(np.square(audio[: n * step].reshape(n, step)), axis=1))


def compare(reference: Any, audio: Any, rate: int) -> dict[str, Any]:
    """Max abs difference, SNR (dB) and envelope correlation over the common length."""
    import numpy as np

    n = min(reference.size, audio.size)
    a, b = reference[:n].astype(np.float64), audio[:n].astype(np.float64)
    diff = a - b
    noise = float(np.sum(diff**2))
    snr = math.inf if noise == 0 else 10 * math.log10(float(np.sum(a**2)) / noise)
    ea, eb = envelope(a, rate), envelope(b, rate)
    corr = 1.0 if np.allclose(ea, eb) else float(np.corrcoef(ea, eb)[0, 1])
    return {
        "samples_reference": int(reference.size),
        "samples": int(audio.size),
        "max_abs_diff": float(np.max(np.abs(diff))) if n else 0.0,
        "snr_db": round(snr, 2) if math.isfinite(snr) else "inf",
        "envelope_corr": round(corr, 5),
    }


def _snr(figures: dict[str, Any]) -> float:
    return math.inf if figures["snr_db"] == "inf" else float(figures["snr_db"])


def compare_all(
    references: list[Any], audio: list[Any], rate: int, reference: str, run: str
) -> dict[str, Any]:
    per = [compare(r, a, rate) for r, a in zip(references, audio, strict=True)]
    worst_snr = min(_snr(p) for p in per)
    return {
        "reference": reference,
        "run": run,
        "worst": {
            "max_abs_diff": max(p["max_abs_diff"] for p in per),
            "snr_db": round(worst_snr, 2) if math.isfinite(worst_snr) else "inf",
            "envelope_corr": min(p["envelope_corr"] for p in per),
            "length_equal": all(p["samples"] == p["samples_reference"] for p in per),
        },
        "per_sentence": per,
    }


def durations_diff(references: list[list[int]], durations: list[list[int]]) -> dict[str, Any]:
    pairs = [(a, b) for r, d in zip(references, durations, strict=True) for a, b in zip(r, d, strict=True)]
    return {
        "phonemes": len(pairs),
        "differ": sum(a != b for a, b in pairs),
        "max_frames": max((abs(a - b) for a, b in pairs), default=0),
        "frames_reference": sum(a for a, _ in pairs),
        "frames": sum(b for _, b in pairs),
        "sentences_equal": sum(r == d for r, d in zip(references, durations, strict=True)),
        "sentences": len(references),
    }


def durations_ok(figures: dict[str, Any]) -> bool:
    return bool(figures["max_frames"] <= 1 and figures["differ"] <= max(1, 0.02 * figures["phonemes"]))


def waveform_ok(figures: dict[str, Any], half: bool) -> bool:
    worst = figures["worst"]
    return _snr(worst) >= (SNR_FP16_DB if half else SNR_FP32_DB) and worst["envelope_corr"] >= (
        ENVELOPE_FP16 if half else ENVELOPE_FP32
    )


def _short(figures: dict[str, Any]) -> str:
    worst = figures["worst"]
    return f"SNR {worst['snr_db']} dB, envelope corr {worst['envelope_corr']}, max abs diff {worst['max_abs_diff']:.2e}"


def _durations_text(figures: dict[str, Any]) -> str:
    return (
        f"{figures['differ']}/{figures['phonemes']} phonemes differ, by at most {figures['max_frames']} frame(s);"
        f" {figures['sentences_equal']}/{figures['sentences']} sentences identical"
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --------------------------------------------------------------------------- results


class Results:
    """PASS/FAIL/SKIP lines and figures, written to ``out/results.json`` after each section."""

    def __init__(self, out: Path | None, deadline: float) -> None:
        self.out = out
        self.deadline = deadline
        self.started = time.monotonic()
        self.data: dict[str, Any] = {"status": "running", "checks": []}
        self.failed = False

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def report(self, status: str, name: str, detail: str = "") -> bool:
        print(f"{status}: {name}" + (f" ({detail})" if detail else ""), flush=True)
        self.data["checks"].append({"status": status, "name": name, "detail": detail})
        self.failed |= status == "FAIL"
        return status != "FAIL"

    def section(self, name: str, figures: Any) -> None:
        self.data[name] = figures
        self.save()

    def save(self, status: str | None = None) -> None:
        if status:
            self.data["status"] = status
        self.data["elapsed_s"] = round(time.monotonic() - self.started, 1)
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str), encoding="utf-8")
        tmp.replace(self.out / "results.json")


# --------------------------------------------------------------------------- running the model


class Runner:
    """The prepared model on one device, and the passes the sections run."""

    def __init__(self, prepared: Path, device: str) -> None:
        import torch

        from synth.engines import vits_torch

        self.torch = torch
        self.vt = vits_torch
        self.device = device
        self.cuda = device.startswith("cuda")
        self.data = json.loads((prepared / "utterances.json").read_text(encoding="utf-8"))
        self.rate = int(self.data["sample_rate"])
        self.scales = self.data["scales"]
        import numpy as np

        with np.load(prepared / "references.npz") as refs:
            self.references = {k: refs[k] for k in refs.files}
        started = time.perf_counter()
        self.model, _ = vits_torch.load_prepared(str(prepared / "weights.pt"))
        self.dtype = torch.float32
        vits_torch.place(self.model, device, self.dtype)
        self.load_s = time.perf_counter() - started

    def use(self, dtype: Any) -> None:
        """Place the model in ``dtype``; float32 on CUDA is exact float32 (TF32 off)."""
        if dtype != self.dtype:
            self.vt.place(self.model, self.device, dtype)
            self.dtype = dtype
        if self.cuda:
            exact = dtype == self.torch.float32
            try:
                self.torch.backends.cuda.matmul.allow_tf32 = not exact
                self.torch.backends.cudnn.allow_tf32 = not exact
            except Exception as exc:  # a torch that refuses the old switches: say so, run on
                print(f"note: TF32 left as it was ({type(exc).__name__}: {exc})", flush=True)

    def run(
        self,
        ids: list[list[int]],
        noise: bool = False,
        seeds: list[int] | None = None,
        durations: list[list[int]] | None = None,
    ) -> list[Any]:
        torch = self.torch
        noise_scale, length_scale, noise_w = (
            (self.scales["noise_scale"], self.scales["length_scale"], self.scales["noise_w"])
            if noise
            else (0.0, 1.0, 0.0)
        )
        batch = [
            self.vt.Utterance(
                row,
                noise_scale,
                length_scale,
                noise_w,
                generator=torch.Generator().manual_seed(seeds[i]) if seeds else None,
                durations=durations[i] if durations else None,
            )
            for i, row in enumerate(ids)
        ]
        with torch.inference_mode():
            out = self.vt.infer(self.model, batch, self.device, self.dtype)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return list(out)

    def dtypes(self) -> list[tuple[str, Any]]:
        return [("float32", self.torch.float32)] + ([("float16", self.torch.float16)] if self.cuda else [])


# --------------------------------------------------------------------------- sections


def environment(device: str, prepared_with: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    env: dict[str, Any] = {
        "device": device,
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "references_made_with": prepared_with,
    }
    try:
        import pynvml  # noqa: F401

        env["pynvml"] = True
    except ImportError:
        env["pynvml"] = False
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        env.update(
            {
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "gpu": props.name,
                "gpu_total_mb": round(props.total_memory / 2**20),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return env


def _references(runner: Runner, quick: bool) -> list[int]:
    """The reference sentences to compare; ``quick`` (the CPU run): the two shortest."""
    refs = list(runner.data["reference_sentences"])
    return sorted(refs, key=lambda i: len(runner.data["phoneme_ids"][i]))[:2] if quick else refs


def _same_durations(runner: Runner, free: list[Any], durations: list[list[int]], **kw: Any) -> list[Any]:
    """Outputs with the given durations: the free run's where they already match (the same pass)."""
    if all(o.durations == list(d) for o, d in zip(free, durations, strict=True)):
        return free
    return runner.run(**kw, durations=durations)


def check_onnxruntime(runner: Runner, results: Results, quick: bool) -> dict[str, Any]:
    data = runner.data
    refs = _references(runner, quick)
    chosen = refs if quick else list(range(len(data["phoneme_ids"])))
    ids = [data["phoneme_ids"][i] for i in chosen]
    ort_durations = [data["onnxruntime_durations"][i] for i in chosen]
    figures: dict[str, Any] = {
        "sentences": chosen,
        "waveform_sentences": refs,
        "baseline_prepare_machine": data.get("baseline_torch_cpu_fp32_vs_onnxruntime"),
        "weights_fp16_rounding_onnxruntime": data.get("weights_fp16_rounding_onnxruntime"),
    }
    for name, dtype in runner.dtypes():
        runner.use(dtype)
        half = name == "float16"
        free = runner.run(ids)
        durations = durations_diff(ort_durations, [o.durations for o in free])
        results.report(
            "PASS" if durations_ok(durations) else "FAIL",
            f"{name} on {runner.device} vs onnxruntime, noise off: durations",
            _durations_text(durations),
        )
        ref_ids = [data["phoneme_ids"][i] for i in refs]
        forced = _same_durations(
            runner,
            [free[chosen.index(i)] for i in refs],
            [data["onnxruntime_durations"][i] for i in refs],
            ids=ref_ids,
        )
        wave = compare_all(
            [runner.references[f"ort_{i}"] for i in refs],
            [o.audio for o in forced],
            runner.rate,
            "onnxruntime on the prepare machine, the same fp16-rounded weights",
            f"torch {name} on {runner.device}",
        )
        results.report(
            "PASS" if waveform_ok(wave, half) else "FAIL",
            f"{name} on {runner.device} vs onnxruntime, noise off: waveform with the same durations",
            _short(wave),
        )
        figures[name] = {"durations": durations, "waveform": wave}
    baseline = figures["baseline_prepare_machine"]
    if baseline:
        print(f"  prepare machine, torch CPU float32 vs onnxruntime: {_short(baseline)}")
    rounding = figures["weights_fp16_rounding_onnxruntime"]
    if rounding:
        print(
            f"  prepare machine, onnxruntime with the fp16-rounded weights vs the voice's own: {_short(rounding)}"
        )
    return figures


def check_fp16(runner: Runner, results: Results, quick: bool) -> dict[str, Any]:
    data = runner.data
    refs = _references(runner, quick)
    ids = [data["phoneme_ids"][i] for i in refs]
    seeds = [data["seeds"][i] for i in refs]
    ref_durations = [data["cpu_fp32_durations"][str(i)] for i in refs]
    references = [runner.references[f"cpu_{i}"] for i in refs]
    figures: dict[str, Any] = {
        "sentences": refs,
        "reference": data["prepared_with"].get("cpu_reference"),
        "seeds": seeds,
    }
    for name, dtype in reversed(runner.dtypes()):  # fp16 first on CUDA: what GPU workers run
        runner.use(dtype)
        half = name == "float16"
        free = runner.run(ids, noise=True, seeds=seeds)
        durations = durations_diff(ref_durations, [o.durations for o in free])
        results.report(
            "PASS" if durations_ok(durations) else "FAIL",
            f"{name} on {runner.device} vs float32 on CPU, same text and seed: durations",
            _durations_text(durations),
        )
        forced = _same_durations(runner, free, ref_durations, ids=ids, noise=True, seeds=seeds)
        wave = compare_all(references, [o.audio for o in forced], runner.rate, "torch float32 CPU", name)
        results.report(
            "PASS" if waveform_ok(wave, half) else "FAIL",
            f"{name} on {runner.device} vs float32 on CPU, same text and seed: waveform with the same durations",
            _short(wave),
        )
        figures[name] = {
            "durations": durations,
            "waveform_same_durations": wave,
            "free_run_samples": [int(o.audio.size) for o in free],
            "reference_samples": [int(r.size) for r in references],
        }
    if not runner.cuda:
        results.report("SKIP", "fp16 on CUDA", "--device cpu: float32 only, against the CPU reference")
    return figures


def check_readers(device: str, results: Results, env: dict[str, str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    modes = ["nvml", "no-init"] if device.startswith("cuda") else ["no-init"]
    if not device.startswith("cuda"):
        results.report("SKIP", "NVML per-process reading follows an allocation", "needs a GPU")
    for mode in modes:
        budget = min(60.0, results.remaining() - 5)
        if budget < 10:
            results.report("FAIL", f"memory reader check {mode}", "time budget spent")
            continue
        try:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).with_name("readers_check.py")), mode, "--device", device],
                capture_output=True,
                text=True,
                timeout=budget,
                env=env,
                check=False,
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            found = json.loads(lines[-1]) if lines else {"status": "FAIL", "detail": proc.stderr[-800:]}
        except subprocess.TimeoutExpired:
            found = {"status": "FAIL", "detail": f"no answer in {budget:.0f} s"}
        figures[mode] = found
        results.report(found["status"], found.get("name", mode), found.get("detail", ""))
    return figures


def _gpu_reading(runner: Runner) -> dict[str, float | None]:
    from synth import telemetry

    reading: dict[str, float | None] = {"rss_mb": round(telemetry.read_rss_mb(), 1)}
    if runner.cuda:
        torch = runner.torch
        index = telemetry.device_index(runner.device)
        value = telemetry.read_gpu_memory_mb(runner.device)
        reading["telemetry_mb"] = None if value is None else round(value, 1)
        reading["allocated_mb"] = round(torch.cuda.memory_allocated(index) / 2**20, 2)
        reading["reserved_mb"] = round(torch.cuda.memory_reserved(index) / 2**20, 1)
        nvml = telemetry.nvml_process_mb(index, os.getpid(), telemetry._nvml())
        reading["nvml_mb"] = None if nvml is None else round(nvml, 1)
    return reading


def check_memory(runner: Runner, results: Results, sentences: int, warmup: int) -> dict[str, Any]:
    """GPU memory after a warm-up and across ``sentences`` more in mixed batches of 1-8."""
    import gc

    from synth import telemetry

    data = runner.data
    pool = list(range(len(data["phoneme_ids"])))
    if not runner.cuda:  # proves the script: the shortest sentences
        pool = sorted(pool, key=lambda i: len(data["phoneme_ids"][i]))[:2]
    runner.use(runner.torch.float16 if runner.cuda else runner.torch.float32)
    rng = random.Random(7)
    seed = iter(range(20_000, 30_000))

    most = 8 if runner.cuda else 4

    def batch(size: int, picked: list[int] | None = None) -> int:
        chosen = picked or [rng.choice(pool) for _ in range(size)]
        runner.run([data["phoneme_ids"][i] for i in chosen], noise=True, seeds=[next(seed) for _ in chosen])
        return len(chosen)

    longest = max(pool, key=lambda i: len(data["phoneme_ids"][i]))
    done = 0
    for _ in range(3 if runner.cuda else 1):  # the largest shape of the run first, with different noise
        done += batch(8, [longest] * min(8, warmup))
    while done < warmup:
        done += batch(min(rng.randint(1, most), warmup - done))
    gc.collect()
    samples: list[dict[str, Any]] = [{"sentences": 0, **_gpu_reading(runner)}]
    done = 0
    while done < sentences:
        done += batch(min(rng.randint(1, most), sentences - done))
        samples.append({"sentences": done, **_gpu_reading(runner)})
    gc.collect()
    first, last = samples[0], samples[-1]
    half = next(s for s in samples if s["sentences"] >= sentences // 2)
    figures: dict[str, Any] = {
        "warmup_sentences": warmup,
        "sentences": sentences,
        "batches": len(samples) - 1,
        "after_warmup": first,
        "after_all": last,
        "at_half": half,
        "samples": samples,
    }
    if not runner.cuda:
        grow = (last["rss_mb"] or 0) - (first["rss_mb"] or 0)
        results.report(
            "PASS",
            f"memory across {sentences} sentences in one process measured",
            f"RSS {first['rss_mb']} -> {last['rss_mb']} MiB ({grow:+.1f}); GPU readings need a GPU",
        )
        return figures
    torch = runner.torch
    index = telemetry.device_index(runner.device)
    reserved = torch.cuda.memory_reserved(index) / 2**20
    value = telemetry.read_gpu_memory_mb(runner.device)
    results.report(
        "PASS" if value is not None and abs(value - reserved) < 1 else "FAIL",
        "synth.telemetry reading is torch's memory_reserved",
        f"reading {value} MiB, memory_reserved {reserved:.1f} MiB",
    )
    telemetry.reset_gpu_peak(runner.device)
    batch(8)
    peak = telemetry.read_gpu_memory_mb(runner.device, peak=True)
    max_reserved = torch.cuda.max_memory_reserved(index) / 2**20
    results.report(
        "PASS" if peak is not None and abs(peak - max_reserved) < 1 else "FAIL",
        "synth.telemetry peak reading is max_memory_reserved after reset_gpu_peak",
        f"peak {peak} MiB, max_memory_reserved {max_reserved:.1f} MiB",
    )

    def growth(key: str, since: dict[str, Any]) -> float | None:
        a, b = since.get(key), last.get(key)
        return None if a is None or b is None else round(b - a, 2)

    figures["growth"] = {
        key: {"over_all": growth(key, first), "second_half": growth(key, half)}
        for key in ("allocated_mb", "reserved_mb", "telemetry_mb", "nvml_mb", "rss_mb")
    }
    allocated = figures["growth"]["allocated_mb"]["over_all"] or 0.0
    late = figures["growth"]["reserved_mb"]["second_half"] or 0.0
    # A leak keeps tensors: allocated grows. The caching allocator may still take one more
    # segment for a batch a little longer than any before (noise varies the durations):
    # reserved growing in the second half by more than that is creep.
    figures["leaks"] = allocated > 1.0
    figures["reserved_grew_in_second_half"] = late > 0.0
    figures["creeps"] = allocated > 1.0 or late > CREEP_MB
    results.report(
        "FAIL" if figures["creeps"] else "PASS",
        f"GPU memory does not creep over {sentences} sentences in one process",
        f"reading {first['telemetry_mb']} MiB after warm-up, {last['telemetry_mb']} MiB after {sentences}"
        f" (second half {late:+.1f}); allocated {first['allocated_mb']} -> {last['allocated_mb']} MiB;"
        f" NVML {first['nvml_mb']} -> {last['nvml_mb']} MiB",
    )
    return figures


def check_throughput(runner: Runner, results: Results, sizes: list[int], jobs: int) -> dict[str, Any]:
    """Audio-s per wall-s, aggregate and per-job RTF, peak memory per pass, at each batch size."""
    torch = runner.torch
    data = runner.data
    pool = list(range(len(data["phoneme_ids"])))
    if not runner.cuda:
        pool = sorted(pool, key=lambda i: len(data["phoneme_ids"][i]))[:2]
    order = [pool[j % len(pool)] for j in range(jobs)]  # each pass mixes the sentence lengths
    runner.use(torch.float16 if runner.cuda else torch.float32)
    from synth import telemetry

    index = telemetry.device_index(runner.device)
    figures: dict[str, Any] = {
        "dtype": str(runner.dtype).replace("torch.", ""),
        "jobs": jobs,
        "job": "one sentence, noise on, seeded; a pass is one vits_torch.infer call",
        "cosyvoice2_trtllm_published": COSYVOICE2_TRTLLM,
    }
    print(f"throughput on {runner.device} ({figures['dtype']}, {jobs} jobs per batch size):", flush=True)
    for size in sizes:
        if results.remaining() < 15:
            results.report("FAIL", f"throughput at batch {size}", "time budget spent")
            continue
        if runner.cuda or size == sizes[0]:  # kernels and allocator for this shape (CPU: once)
            runner.run([data["phoneme_ids"][i] for i in order[:size]], noise=True, seeds=list(range(size)))
        audio_s, wall_s, rtfs, peaks = 0.0, 0.0, [], []
        for start in range(0, jobs, size):
            picked = order[start : start + size]
            if runner.cuda:
                torch.cuda.reset_peak_memory_stats(index)
            began = time.perf_counter()
            outs = runner.run(
                [data["phoneme_ids"][i] for i in picked],
                noise=True,
                seeds=[50_000 + start + k for k in range(len(picked))],
            )
            wall = time.perf_counter() - began
            seconds = [o.audio.size / runner.rate for o in outs]
            audio_s += sum(seconds)
            wall_s += wall
            rtfs += [wall / s for s in seconds if s > 0]
            peaks.append(
                torch.cuda.max_memory_allocated(index) / 2**20
                if runner.cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            )
        row = {
            "passes": math.ceil(jobs / size),
            "audio_s": round(audio_s, 2),
            "wall_s": round(wall_s, 3),
            "audio_s_per_wall_s": round(audio_s / wall_s, 1),
            "rtf_aggregate": round(wall_s / audio_s, 5),
            "rtf_per_job_median": round(_percentile(rtfs, 0.5), 5),
            "rtf_per_job_p90": round(_percentile(rtfs, 0.9), 5),
            "rtf_per_job_max": round(max(rtfs), 5),
            "peak_mb_per_pass": round(max(peaks), 1),
            "peak_mb_per_job": round(max(peaks) / size, 1) if runner.cuda else None,
            "peak_measure": "max_memory_allocated per pass" if runner.cuda else "process peak RSS",
        }
        figures[str(size)] = row
        print(
            f"  batch {size:>2}: {row['audio_s_per_wall_s']:8.1f} audio-s per wall-s, RTF {row['rtf_aggregate']:.4f}"
            f" (per job median {row['rtf_per_job_median']:.4f}, p90 {row['rtf_per_job_p90']:.4f}),"
            f" peak {row['peak_mb_per_pass']:.1f} MiB per pass",
            flush=True,
        )
    measured = [str(s) for s in sizes if str(s) in figures]
    if len(measured) == len(sizes):
        ratio = figures[measured[-1]]["audio_s_per_wall_s"] / max(
            figures[measured[0]]["audio_s_per_wall_s"], 1e-9
        )
        results.report(
            "PASS",
            "throughput and per-job RTF measured at batch " + ", ".join(measured),
            f"batch {measured[-1]} / batch {measured[0]} throughput = {ratio:.2f};"
            " CosyVoice2 TensorRT-LLM as published: RTF 0.099 at 1, 0.039 at 16",
        )
    return figures


# --------------------------------------------------------------------------- main


def _ensure_prepared(arg: str | None) -> Path:
    if arg:
        return Path(arg).resolve()
    sys.path.insert(0, str(ROOT))
    from tests.gpu.prepare import prepare

    out = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    prepare(out, wheels=False, quick=True)
    return out


def _setup(prepared: Path) -> None:
    for path in (str(ROOT), str(prepared / "pysrc")):
        if path not in sys.path:
            sys.path.insert(0, path)


VOXCPM_NEEDS_S = 30  # build, load, 20 short jobs, a fresh child: about 15 s on a GPU


def _voxcpm_section(device: str, results: Results, env: dict[str, str]) -> None:
    """The VoxCPM section, under ``voxcpm`` in results.json; a failure is a FAIL line, never a crash."""
    import gc
    import importlib.util

    from tests.gpu import voxcpm_check

    name = "VoxCPM2 tiny model: memory and leaks"
    started = time.monotonic()
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    figures: dict[str, Any]
    if importlib.util.find_spec("voxcpm") is not None and results.remaining() < VOXCPM_NEEDS_S:
        results.report("FAIL", name, f"time budget spent ({results.remaining():.0f} s left)")
        figures = {"error": "time budget spent"}
    else:
        try:
            figures = voxcpm_check.check_voxcpm(device, results, env)
        except Exception:
            import traceback

            traceback.print_exc()
            last = traceback.format_exc().strip().splitlines()[-1]
            results.report("FAIL", name, last)
            figures = {"error": last}
    figures["section_s"] = round(time.monotonic() - started, 1)
    results.section("voxcpm", figures)


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests/gpu/engine_check.py")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--prepared", default=None, help="folder from `make gpu-check-prepare`")
    parser.add_argument("--out", default=None, help="folder for results.json")
    parser.add_argument("--budget-s", type=float, default=240.0, help="time for all sections")
    parser.add_argument(
        "--sentences", type=int, default=None, help="memory run (default 200 on CUDA, 6 on CPU)"
    )
    args = parser.parse_args()
    results = Results(Path(args.out) if args.out else None, time.monotonic() + args.budget_s)
    prepared = _ensure_prepared(args.prepared)
    if not args.prepared:  # ours: 30 MiB of weights not to leave behind
        import atexit
        import shutil

        atexit.register(shutil.rmtree, prepared, True)
    _setup(prepared)
    import torch

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        results.report("FAIL", f"device {args.device}", f"torch {torch.__version__} sees no CUDA device")
        results.save("failed")
        return 1
    if not cuda:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    quick = not cuda
    try:
        runner = Runner(prepared, args.device)
        results.section("environment", environment(args.device, runner.data.get("prepared_with", {})))
    except Exception as exc:
        import traceback

        traceback.print_exc()
        results.report("FAIL", "weights load from the prepared fp16 file", f"{type(exc).__name__}: {exc}")
        results.save("failed")
        return 1
    print(json.dumps(results.data["environment"]), flush=True)
    results.report("PASS", "weights load from the prepared fp16 file", f"{runner.load_s:.1f} s")
    reader_env = dict(os.environ)
    reader_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), reader_env.get("PYTHONPATH")) if p)
    sections = [
        ("onnxruntime_parity", 20, lambda: check_onnxruntime(runner, results, quick)),
        ("fp16_vs_cpu_fp32", 15, lambda: check_fp16(runner, results, quick)),
        ("memory_readers", 15, lambda: check_readers(args.device, results, reader_env)),
        (
            "gpu_memory",
            20,
            lambda: check_memory(runner, results, args.sentences or (200 if cuda else 6), 40 if cuda else 2),
        ),
        # CPU: batch 1 and 4 of 4 short jobs (the same code; 32 jobs cost make test 40 s and more here).
        (
            "throughput",
            30,
            lambda: check_throughput(runner, results, [1, 8, 32] if cuda else [1, 4], 128 if cuda else 4),
        ),
    ]
    for name, needs, section in sections:
        if results.remaining() < needs:
            results.report("FAIL", name, f"time budget spent ({results.remaining():.0f} s left)")
            continue
        started = time.monotonic()
        try:
            figures = section()
        except Exception as exc:  # one section's failure still leaves the others' figures
            import traceback

            traceback.print_exc()
            results.report("FAIL", name, f"{type(exc).__name__}: {exc}")
            figures = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(figures, dict):
            figures["section_s"] = round(time.monotonic() - started, 1)
        results.section(name, figures)
    # VoxCPM last and on its own (tests/gpu/voxcpm_check.py), the Piper model freed first so
    # its memory figures start clean; whatever happens there, the figures above stand.
    del runner.model
    _voxcpm_section(args.device, results, reader_env)
    results.save("failed" if results.failed else "passed")
    print(
        f"engine check: {'FAIL' if results.failed else 'PASS'} in {results.data['elapsed_s']} s", flush=True
    )
    return 1 if results.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
