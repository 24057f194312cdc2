"""The GPU check's VoxCPM section: the service's own VoxCPM engine on a tiny random-weight model.

No VoxCPM weights reach the GPU machine, so this builds a tiny random-weight VoxCPM2
model there (tests/gpu/voxcpm_tiny.py, about 4 MB) and runs it through the engine the
workers run, ``synth.engines.voxcpm.VoxCPMEngine``: its strict loading (every tensor from
the files), its dtype (float32 on the CPU; bfloat16 on CUDA where supported, else
float16), its import of the package's model module without torchaudio
(synth.engines.voxcpm_package), its streaming generation sentence by sentence with the
job's seed, and its cloning prompt on four of the 20 jobs. It measures memory only: the
audio of random weights is noise, and its speed says nothing of VoxCPM's.

- load: memory before and after ``engine.load(device)``;
- 20 jobs in one process, each its own seed, one to three sentences, jobs 1, 6, 11 and 16
  with a prompt wav and its transcript; after each: RSS, and on CUDA torch's
  ``memory_allocated`` / ``memory_reserved`` and the job's ``max_memory_allocated``;
- creep: from job 2 to job 20 (job 1 sets up the allocator and the prompt path's first
  compilations), ``memory_allocated`` over 1 MiB on CUDA is a leak (FAIL; the Piper section's
  rule); on the CPU, RSS over :data:`RSS_CREEP_MB` (FAIL);
- a recycle as a worker child does it: the engine dropped (``unload``, ``gc.collect()``, on
  CUDA ``empty_cache``), on CUDA allocated back within 1 MiB of the reading before the first
  load (FAIL otherwise); then a fresh engine loaded and one job run: its memory back to the
  first engine's after its first job, within 1 MiB allocated on CUDA, :data:`RSS_RELOAD_MB`
  of RSS on the CPU (FAIL otherwise);
- a fresh child process that loads the engine and runs one job (what a recycled worker
  child holds), with its own figures.

``tests/gpu/check.sh --device cpu`` (``make test``) runs it all on the CPU with the
project's venv, which has voxcpm and its imports: RSS figures only. Where voxcpm is not
installed the section SKIPs; where it is installed and its model module does not import,
it FAILs (on a GPU machine the carried wheels complete it: tests/gpu/wheels.py). Run last by
tests/gpu/engine_check.py; also ``python tests/gpu/voxcpm_check.py child --model DIR --device D``
(the child process).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any, Protocol

LEAK_MB = 1.0  # CUDA: allocated growth from job 2 to the last job, or left after dropping the engine
RSS_CREEP_MB = 64.0  # CPU: RSS growth from job 2 to the last job that counts as creep
RSS_RELOAD_MB = 64.0  # CPU: RSS after the reloaded engine's first job against the first engine's
JOBS = 20
# Jobs 1, 6, 11, 16 take a prompt wav and its text; job 1 so the one-time cost of the prompt
# path (librosa, soundfile, numba's first compilations) lands before job 2, the creep rule's start.
PROMPT_EVERY = 5
TEXTS = (
    "Hello there!",
    "The keeper climbed the stairs. He trimmed the wick.",
    "Is this a question, or is it not?",
    "Numbers such as forty-two are read as words. Short. One more.",
    "Short.",
)
PROMPT_TEXT = "This is the voice to follow."
VOICE = "voxcpm:default"


class Reporter(Protocol):
    """What engine_check's Results gives this section."""

    def report(self, status: str, name: str, detail: str = "") -> bool: ...

    def remaining(self) -> float: ...


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: the peak is what there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reading(device: str) -> dict[str, float]:
    """RSS, and on CUDA torch's allocated and reserved memory, in MiB."""
    figures = {"rss_mb": round(_rss_mb(), 1)}
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
        figures["allocated_mb"] = round(torch.cuda.memory_allocated(device) / 2**20, 3)
        figures["reserved_mb"] = round(torch.cuda.memory_reserved(device) / 2**20, 1)
    return figures


def write_prompt_wav(path: Path, seconds: float = 1.0, rate: int = 16000) -> None:
    """A 16-bit mono wav at the VAE's own rate (so librosa.load does not resample): a seeded chirp."""
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(5)
    audio = 0.3 * np.sin(2 * math.pi * (150 + 200 * t) * t) + 0.02 * rng.standard_normal(t.size)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def load(model_dir: Path, device: str) -> Any:
    """The worker's engine on ``model_dir``, loaded on ``device`` (strict: every tensor from the files)."""
    from synth.engines.voxcpm import VoxCPMEngine

    threads = None if device.startswith("cuda") else 1  # make test shares a 2-core machine
    engine = VoxCPMEngine(str(model_dir), threads=threads)
    engine.load(device)
    return engine


def drop(engine: Any, device: str) -> None:
    """What ending a worker child gives back, in-process: the model dropped, the caches emptied."""
    engine.unload()
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def run_job(engine: Any, index: int, prompt_wav: Path, device: str) -> dict[str, Any]:
    """One job through the engine (its sentences streamed one by one); its memory figures."""
    import torch

    from synth.engines.base import VoiceParams, VoicePrompt

    cuda = device.startswith("cuda")
    text = TEXTS[index % len(TEXTS)]
    prompt = index % PROMPT_EVERY == 0
    params = VoiceParams(
        voice=VOICE,
        seed=1000 + index,
        prompt=VoicePrompt(str(prompt_wav), 16000, transcript=PROMPT_TEXT) if prompt else None,
    )
    sentences = re.split(r"(?<=[.!?])\s+", text)  # as the service's splitter cuts these texts
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.monotonic()
    samples = sum(int(audio.size) for audio in engine.synthesize(sentences, params, total=len(sentences)))
    figures: dict[str, Any] = {
        "job": index + 1,
        "mode": "prompt wav + text" if prompt else "own voice",
        "sentences": len(sentences),
        "samples": samples,
        "wall_s": round(time.monotonic() - started, 2),
        **reading(device),
    }
    if cuda:
        figures["peak_allocated_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 3)
    return figures


def child(model_dir: Path, device: str) -> dict[str, Any]:
    """In a fresh process: load the engine, one job with the prompt wav (the largest kind), figures."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.init()
    before = reading(device)
    engine = load(model_dir, device)
    loaded = reading(device)
    with tempfile.TemporaryDirectory(prefix="voxcpm-child-") as tmp:
        wav = Path(tmp) / "prompt.wav"
        write_prompt_wav(wav)
        job = run_job(engine, 5, wav, device)  # prompt wav + text
    return {"before_load": before, "after_load": loaded, "job": job, "dtype": engine.dtype}


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> float | None:
    a, b = after.get(key), before.get(key)
    return None if a is None or b is None else round(a - b, 3)


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for package in (
        "voxcpm",
        "transformers",
        "tokenizers",
        "pydantic",
        "librosa",
        "safetensors",
        "soundfile",
    ):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def _jobs_line(jobs: list[dict[str, Any]], key: str) -> str:
    return " ".join(f"{j[key]:g}" for j in jobs)


def check_voxcpm(device: str, results: Reporter, env: dict[str, str]) -> dict[str, Any]:
    """The section: build, load, 20 jobs, creep, a recycle, a fresh child. Figures for results.json."""
    name = "VoxCPM2 tiny model"
    if importlib.util.find_spec("voxcpm") is None:
        results.report(
            "SKIP",
            f"{name}: memory and leaks",
            "voxcpm is not installed in this Python (the prepared folder carries it for the GPU machine)",
        )
        return {"skipped": "voxcpm is not installed"}
    from synth.engines.voxcpm_package import PackageMissing, model_module

    try:
        model_module("voxcpm2")  # the engine's import: voxcpm.model.voxcpm2 without torchaudio
    except PackageMissing as exc:
        results.report("FAIL", f"{name}: the engine's model module imports", str(exc))
        return {"error": str(exc)}
    import torch

    from tests.gpu.voxcpm_tiny import build_tiny_voxcpm2

    cuda = device.startswith("cuda")
    key = "allocated_mb" if cuda else "rss_mb"
    figures: dict[str, Any] = {
        "what": "a tiny random-weight VoxCPM2 (tests/gpu/voxcpm_tiny.py) through synth.engines.voxcpm:"
        " memory and leak figures only; its audio is noise and its speed is not VoxCPM's",
        "versions": _versions(),
        "jobs_planned": JOBS,
        "memory_key": key,
    }
    tmp = Path(tempfile.mkdtemp(prefix="voxcpm-tiny-"))
    try:
        started = time.monotonic()
        figures["model"] = build_tiny_voxcpm2(tmp / "model", seed=0)
        figures["model"]["build_s"] = round(time.monotonic() - started, 2)
        wav = tmp / "prompt.wav"
        write_prompt_wav(wav)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        figures["before_load"] = before = reading(device)
        engine = load(tmp / "model", device)
        figures["after_load"] = loaded = reading(device)
        figures["dtype"], figures["load_s"] = engine.dtype, round(engine.load_s, 2)
        results.report(
            "PASS",
            f"{name} loads through synth.engines.voxcpm on {device} ({engine.dtype}, strict)",
            f"{figures['model']['parameters']} parameters, {figures['model']['bytes'] / 2**20:.1f} MB of files;"
            + (
                f" allocated +{_delta(loaded, before, 'allocated_mb')} MiB,"
                f" reserved +{_delta(loaded, before, 'reserved_mb')} MiB"
                if cuda
                else f" RSS {before['rss_mb']} -> {loaded['rss_mb']} MiB"
            ),
        )
        jobs: list[dict[str, Any]] = []
        figures["jobs"] = jobs
        for index in range(JOBS):
            if results.remaining() < 20:  # keep time for the recycle and the child
                results.report("FAIL", f"{name}: {JOBS} jobs", f"time budget spent after {index} jobs")
                break
            jobs.append(run_job(engine, index, wav, device))
        unit = "MiB allocated" if cuda else "MiB RSS"
        if len(jobs) == JOBS:
            second, last = jobs[1], jobs[-1]
            grew = round(last[key] - second[key], 3)
            figures["growth_job2_to_last"] = {
                k: _delta(last, second, k) for k in ("allocated_mb", "reserved_mb", "rss_mb")
            }
            bound = LEAK_MB if cuda else RSS_CREEP_MB
            figures["leaks"] = grew > bound
            prompts = sum("prompt" in j["mode"] for j in jobs)
            extra = ""
            if cuda:
                peaks = [j["peak_allocated_mb"] for j in jobs]
                extra = (
                    f"; reserved {second['reserved_mb']} -> {last['reserved_mb']} MiB;"
                    f" peak per job {min(peaks)}-{max(peaks)} MiB"
                )
            results.report(
                "FAIL" if figures["leaks"] else "PASS",
                f"{name}: {JOBS} jobs in one process ({prompts} with a prompt wav), no creep over {bound:g} {unit}",
                f"{unit} after each job: {_jobs_line(jobs, key)}; job 2 -> {JOBS}: {grew:+.3f}{extra}",
            )
        # A recycle, in-process: the engine dropped, then a fresh one loaded and one job run.
        drop(engine, device)
        del engine
        figures["after_drop"] = dropped = reading(device)
        if cuda:
            left = _delta(dropped, before, "allocated_mb") or 0.0
            figures["drop_returns_to_baseline"] = left <= LEAK_MB
            results.report(
                "PASS" if figures["drop_returns_to_baseline"] else "FAIL",
                f"{name}: dropping the engine returns allocated memory to before the load",
                f"allocated {before['allocated_mb']} MiB before load, {loaded['allocated_mb']} after,"
                f" {dropped['allocated_mb']} after unload + gc + empty_cache ({left:+.3f});"
                f" reserved {dropped['reserved_mb']} MiB",
            )
        engine = load(tmp / "model", device)
        figures["after_reload"] = reloaded = reading(device)
        figures["recycled_job"] = again = run_job(engine, 0, wav, device)
        if jobs:
            first = jobs[0]
            back = round(again[key] - first[key], 3)
            bound = LEAK_MB if cuda else RSS_RELOAD_MB
            figures["recycle_returns_to_first_level"] = back <= bound
            results.report(
                "PASS" if figures["recycle_returns_to_first_level"] else "FAIL",
                f"{name}: after a recycle (drop, reload, job 1 again) memory is back at its first level",
                f"{unit}: {first[key]:g} after the first engine's job 1, {jobs[-1][key]:g} after job {len(jobs)},"
                f" {dropped[key]:g} after the drop, {reloaded[key]:g} after the reload,"
                f" {again[key]:g} after its job 1 ({back:+.3f}; bound {bound:g})",
            )
        drop(engine, device)
        del engine
        figures["fresh_process"] = _fresh_process(tmp / "model", device, results, env)
        return figures
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _fresh_process(model_dir: Path, device: str, results: Reporter, env: dict[str, str]) -> dict[str, Any]:
    name = "VoxCPM2 tiny model in a fresh process (a recycled child): load and one job"
    budget = min(90.0, results.remaining() - 5)
    if budget < 10:
        results.report("FAIL", name, "time budget spent")
        return {"error": "time budget spent"}
    command = [sys.executable, str(Path(__file__)), "child", "--model", str(model_dir), "--device", device]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=budget, env=env, check=False)
    except subprocess.TimeoutExpired:
        results.report("FAIL", name, f"no answer in {budget:.0f} s")
        return {"error": f"no answer in {budget:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        results.report("FAIL", name, f"exit {proc.returncode}: {tail}")
        return {"error": tail, "returncode": proc.returncode}
    found: dict[str, Any] = json.loads(lines[-1])
    job, loaded, before = found["job"], found["after_load"], found["before_load"]
    if device.startswith("cuda"):
        detail = (
            f"allocated {loaded['allocated_mb']} MiB after load, {job['allocated_mb']} after the job"
            f" (peak {job['peak_allocated_mb']}), reserved {job['reserved_mb']} MiB; RSS {job['rss_mb']} MiB"
        )
    else:
        detail = f"RSS {before['rss_mb']} MiB at start, {loaded['rss_mb']} after load, {job['rss_mb']} after the job"
    results.report("PASS", name, detail)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests/gpu/voxcpm_check.py")
    parser.add_argument("mode", choices=["child"])
    parser.add_argument("--model", required=True, help="a tiny VoxCPM2 model directory")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:  # run as a script: synth and tests from the checkout
        sys.path.insert(0, root)
    print(json.dumps(child(Path(args.model), args.device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
