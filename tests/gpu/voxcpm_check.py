"""The GPU check's VoxCPM section: memory and leaks of VoxCPM2 with a tiny random-weight model.

No VoxCPM weights reach the GPU machine, so this builds a tiny random-weight VoxCPM2
model there (tests/gpu/voxcpm_tiny.py, about 4 MB), loads it through
``voxcpm.model.VoxCPM2Model.from_local`` (no torch.compile, no denoiser, no downloads)
and runs short jobs through the package's own ``generate`` and ``generate_streaming``,
four of the 20 with a prompt wav and its text (voice cloning), as an engine would.
It measures memory only: the audio of random weights is noise, and its speed says
nothing of VoxCPM's, so no timing of the jobs is reported.

- after load: torch's ``memory_allocated`` / ``memory_reserved`` (CUDA), RSS (always);
- per job: ``max_memory_allocated`` after ``reset_peak_memory_stats``, and
  ``memory_allocated`` / ``memory_reserved`` after it (CUDA); RSS after it;
- creep: ``memory_allocated`` after the last job against after the second (the first
  sets up the allocator): over 1 MiB is a leak (FAIL), the Piper section's rule;
- after recycling: the model deleted, ``gc.collect()``, ``torch.cuda.empty_cache()``:
  allocated back within 1 MiB of the reading before the load (FAIL otherwise);
- a fresh child process that loads the model and runs one job (what a recycled
  worker child would hold), with its own figures.

On the CPU (``make test``, or a scratch venv with voxcpm) the figures are RSS only and
the section proves the script (PASS when it ran). Where voxcpm is not installed (the
project's own venv), or on the CPU cannot be imported, the section SKIPs; on CUDA an
import failure is a FAIL (the carried wheels are meant to complete it). Run last by tests/gpu/engine_check.py; also
``python tests/gpu/voxcpm_check.py child --model DIR --device D`` (the child process).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any, Protocol

LEAK_MB = 1.0  # allocated growth from job 2 to the last job, or left after recycling, that counts as a leak
JOBS = 20
MAX_PATCHES = 24  # generate's max_len: at most 24 patches (3.8 s of 48 kHz audio) per job
# Jobs 1, 6, 11, 16 take a prompt wav and its text; job 1 so the one-time cost of the
# prompt path (librosa, soundfile, numba's first compilations) lands before job 2, the
# creep rule's starting point.
PROMPT_EVERY = 5
TEXTS = (
    "Hello there!",
    "The keeper climbed the stairs.",
    "Is this a question, or is it not?",
    "Numbers such as forty-two are read as words.",
    "Short.",
)
PROMPT_TEXT = "This is the voice to follow."


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
    """The package's own loader, as an engine would call it, minus torch.compile."""
    from voxcpm.model import VoxCPM2Model

    return VoxCPM2Model.from_local(str(model_dir), optimize=False, device=device)


def run_job(model: Any, index: int, prompt_wav: Path, device: str) -> dict[str, Any]:
    """One job through generate (even) or generate_streaming (odd); its memory figures."""
    import torch

    cuda = device.startswith("cuda")
    # The random stop head stops a job as soon as min_len allows: min_len spreads the jobs
    # over 3-18 patches instead, so the allocator sees different lengths, as in service.
    min_len = 2 + (index * 5) % 16
    kwargs: dict[str, Any] = {
        "target_text": TEXTS[index % len(TEXTS)],
        "max_len": MAX_PATCHES,
        "min_len": min_len,
    }
    prompt = index % PROMPT_EVERY == 0
    if prompt:
        kwargs.update(prompt_wav_path=str(prompt_wav), prompt_text=PROMPT_TEXT)
    streaming = index % 2 == 1
    torch.manual_seed(1000 + index)  # the flow-matching noise
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    if streaming:
        chunks = [chunk for chunk in model.generate_streaming(**kwargs)]
        samples = sum(int(c.shape[-1]) for c in chunks)
        del chunks
    else:
        samples = int(model.generate(**kwargs).shape[-1])
    figures: dict[str, Any] = {
        "job": index + 1,
        "mode": ("prompt wav + text, " if prompt else "") + ("streaming" if streaming else "generate"),
        "min_len": min_len,
        "samples": samples,
        **reading(device),
    }
    if cuda:
        figures["peak_allocated_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 3)
    return figures


def child(model_dir: Path, device: str) -> dict[str, Any]:
    """In a fresh process: load, one job with the prompt wav (the largest kind), figures."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    if device.startswith("cuda"):
        torch.cuda.init()
    before = reading(device)
    model = load(model_dir, device)
    loaded = reading(device)
    with tempfile.TemporaryDirectory(prefix="voxcpm-child-") as tmp:
        wav = Path(tmp) / "prompt.wav"
        write_prompt_wav(wav)
        job = run_job(model, 5, wav, device)  # prompt wav + text, streaming
    return {"before_load": before, "after_load": loaded, "job": job}


def _unloaded(model: Any, model_dir: Path) -> list[str]:
    """Names of the model's parameters that neither safetensors file holds."""
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
    with safe_open(str(model_dir / "audiovae.safetensors"), framework="pt") as fh:
        names |= {f"audio_vae.{key}" for key in fh.keys()}
    return sorted(name for name, _ in model.named_parameters() if name not in names)


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> float | None:
    a, b = after.get(key), before.get(key)
    return None if a is None or b is None else round(a - b, 3)


def check_voxcpm(device: str, results: Reporter, env: dict[str, str]) -> dict[str, Any]:
    """The section: build, load, jobs, creep, recycling, fresh child. Figures for results.json."""
    if importlib.util.find_spec("voxcpm") is None:
        results.report(
            "SKIP",
            "VoxCPM2 tiny model: memory and leaks",
            "voxcpm is not installed in this Python (not a project dependency; the prepared"
            " folder carries it for the GPU machine)",
        )
        return {"skipped": "voxcpm is not installed"}
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bar per generated patch in check.log
    try:
        import voxcpm.model  # noqa: F401  (voxcpm.core, both model versions and their imports)
    except Exception as exc:
        # On the CPU this is a Python that has voxcpm but not its whole import chain (the
        # project's venv with the carried voxcpm wheel lacks transformers): nothing to
        # measure. On CUDA the carried wheels should have completed it: a failure.
        status = "FAIL" if device.startswith("cuda") else "SKIP"
        reason = f"voxcpm cannot be imported: {type(exc).__name__}: {exc}"
        results.report(status, "VoxCPM2 tiny model: memory and leaks", reason)
        return {"error" if status == "FAIL" else "skipped": reason}
    from importlib import metadata

    import torch

    from tests.gpu.voxcpm_tiny import build_tiny_voxcpm2

    cuda = device.startswith("cuda")
    versions: dict[str, str | None] = {}
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
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    figures: dict[str, Any] = {
        "what": "a tiny random-weight VoxCPM2 (tests/gpu/voxcpm_tiny.py): memory and leak figures only;"
        " its audio is noise and its speed is not VoxCPM's",
        "versions": versions,
        "jobs_planned": JOBS,
        "max_patches_per_job": MAX_PATCHES,
    }
    name = "VoxCPM2 tiny model"
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
        model = load(tmp / "model", device)
        figures["after_load"] = loaded = reading(device)
        figures["dtype"] = str(model.config.dtype)
        # from_local loads with strict=False: make sure every parameter came from the files.
        figures["parameters_not_in_files"] = unloaded = _unloaded(model, tmp / "model")
        if unloaded:
            raise RuntimeError(f"{len(unloaded)} parameters not in the model files, e.g. {unloaded[:3]}")
        results.report(
            "PASS",
            f"{name} loads through voxcpm's from_local on {device}",
            f"{figures['model']['parameters']} parameters, {figures['model']['bytes'] / 2**20:.1f} MB of files;"
            + (
                f" allocated +{_delta(loaded, before, 'allocated_mb')} MiB,"
                f" reserved +{_delta(loaded, before, 'reserved_mb')} MiB"
                if cuda
                else f" RSS +{_delta(loaded, before, 'rss_mb')} MiB"
            ),
        )
        jobs: list[dict[str, Any]] = []
        figures["jobs"] = jobs
        for index in range(JOBS):
            if results.remaining() < 20:  # keep time for recycling and the child
                results.report("FAIL", f"{name}: {JOBS} jobs", f"time budget spent after {index} jobs")
                break
            jobs.append(run_job(model, index, wav, device))
        key = "allocated_mb" if cuda else "rss_mb"
        if len(jobs) == JOBS:
            second, last = jobs[1], jobs[-1]
            grew = round(last[key] - second[key], 3)
            figures["growth_job2_to_last"] = {
                k: _delta(last, second, k) for k in ("allocated_mb", "reserved_mb", "rss_mb")
            }
            prompts = sum("prompt" in j["mode"] for j in jobs)
            if cuda:
                figures["leaks"] = grew > LEAK_MB
                peaks = [j["peak_allocated_mb"] for j in jobs]
                results.report(
                    "FAIL" if figures["leaks"] else "PASS",
                    f"{name}: memory does not creep over {JOBS} jobs ({prompts} with a prompt wav)",
                    f"allocated {second[key]} MiB after job 2, {last[key]} MiB after job {JOBS} ({grew:+.3f});"
                    f" reserved {second['reserved_mb']} -> {last['reserved_mb']} MiB;"
                    f" peak per job {min(peaks)}-{max(peaks)} MiB",
                )
            else:
                results.report(
                    "PASS",
                    f"{name}: memory over {JOBS} jobs measured ({prompts} with a prompt wav)",
                    f"RSS {second[key]} MiB after job 2, {last[key]} MiB after job {JOBS} ({grew:+.1f});"
                    " GPU readings need a GPU",
                )
        # Recycling in-process: what a worker gets back by dropping the model.
        del model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        figures["after_recycling"] = after = reading(device)
        if cuda:
            left = _delta(after, before, "allocated_mb") or 0.0
            figures["recycling_returns_to_baseline"] = left <= LEAK_MB
            results.report(
                "PASS" if figures["recycling_returns_to_baseline"] else "FAIL",
                f"{name}: deleting the model returns memory to the baseline",
                f"allocated {before['allocated_mb']} MiB before load, {loaded['allocated_mb']} after,"
                f" {after['allocated_mb']} after del + gc + empty_cache ({left:+.3f});"
                f" reserved {after['reserved_mb']} MiB",
            )
        else:
            results.report(
                "PASS",
                f"{name}: memory after deleting the model measured",
                f"RSS {before['rss_mb']} MiB before load, {loaded['rss_mb']} after, {after['rss_mb']} after del + gc",
            )
        figures["fresh_process"] = _fresh_process(tmp / "model", device, results, env)
        return figures
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _fresh_process(model_dir: Path, device: str, results: Reporter, env: dict[str, str]) -> dict[str, Any]:
    name = "VoxCPM2 tiny model in a fresh process: load and one job"
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
    if args.device == "cpu":
        import torch

        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    print(json.dumps(child(Path(args.model), args.device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
