"""Synthesis benchmark: RTF, throughput with 1 and 2 processes, peak RSS vs text length,
and Piper on PyTorch vs onnxruntime (CPU RTF for the same texts).

Run: ``python tests/bench/bench_synth.py [--quick]``. Prints figures; asserts nothing.
Each measurement runs in a fresh process so peak RSS is that request's own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOICES = {"piper": "en_US-joe-medium", "espeak": "espeak-en-us"}
SENTENCE = "The keeper climbed the stairs and trimmed the wick while the ships passed in the dark."
SHORT = "Hello there, this is a short paragraph for the benchmark."
LONG = " ".join([SENTENCE] * 12)

_CHILD = """
import json, sys, time, tempfile, os
from synth import Synthesizer, SynthesisRequest
voice, text, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
runtime, threads = sys.argv[4], int(sys.argv[5]) or None
s = Synthesizer(engines=["espeak" if voice.startswith("espeak-") else "piper"], threads=threads, piper_runtime=runtime)
s.load([voice]); s.warm_up()
out = os.path.join(tempfile.mkdtemp(), "b.wav")
audio = 0.0; wall = 0.0; cpu = 0.0; peak = 0.0
for _ in range(repeats):
    t, c = time.perf_counter(), time.process_time()
    r = s.synthesize(SynthesisRequest(text, voice=voice), out)
    wall += time.perf_counter() - t; cpu += time.process_time() - c
    audio += r.duration_seconds; peak = max(peak, r.peak_rss_mb)
print(json.dumps({"audio": audio, "wall": wall, "cpu": cpu, "peak": peak}))
"""


def _child(
    voice: str, text: str, repeats: int = 1, runtime: str = "onnxruntime", threads: int = 0
) -> subprocess.Popen[str]:
    """A fresh process; ``threads`` 0 leaves the engine's default."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, voice, text, str(repeats), runtime, str(threads)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("benchmark child failed")
    data: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return data


def runtimes(say: Callable[[str], None], quick: bool) -> None:
    """Piper on torch vs onnxruntime, one inference thread each (the worker default), same texts.

    CPU seconds per audio second are printed beside the RTF: on a shared machine
    the wall clock depends on the neighbours, the CPU time much less.
    """
    voice = VOICES["piper"]
    for label, text in (("short", SHORT), ("long", LONG)):
        rtf, cpu = {}, {}
        for runtime in ("onnxruntime", "torch"):
            r = _result(_child(voice, text, 2 if quick else 3, runtime, threads=1))
            rtf[runtime], cpu[runtime] = r["wall"] / r["audio"], r["cpu"] / r["audio"]
            say(
                f"piper/{runtime}: {label} paragraph RTF = {rtf[runtime]:.4f}, "
                f"CPU-s per audio-s = {cpu[runtime]:.4f}, peak RSS {r['peak']:.0f} MB"
            )
        say(
            f"piper: torch / onnxruntime ({label}) RTF = {rtf['torch'] / rtf['onnxruntime']:.2f}, "
            f"CPU time = {cpu['torch'] / cpu['onnxruntime']:.2f}"
        )


def run(quick: bool) -> list[str]:
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"# synth benchmark ({'quick' if quick else 'full'}), {os.cpu_count()} CPUs")
    runtimes(say, quick)
    sizes = (1, 10, 100) if quick else (1, 10, 100, 1000)
    for engine, voice in VOICES.items():
        for label, text in (("short", SHORT), ("long", LONG)):
            r = _result(_child(voice, text, 3))
            say(f"{engine}: RTF {label} paragraph = {r['wall'] / r['audio']:.4f} ({r['audio']:.1f} s audio)")
        reps = 2 if quick else 4
        t0 = time.perf_counter()
        one = _result(_child(voice, LONG, reps))
        wall1 = time.perf_counter() - t0
        say(
            f"{engine}: 1 process  = {one['audio'] / one['wall']:.1f} audio-s per wall-s "
            f"(synthesis only; {one['audio'] / wall1:.1f} incl. start-up)"
        )
        t0 = time.perf_counter()
        procs = [_child(voice, LONG, reps) for _ in range(2)]
        both = [_result(p) for p in procs]
        wall2 = time.perf_counter() - t0
        total_audio = sum(b["audio"] for b in both)
        slowest = max(b["wall"] for b in both)
        say(
            f"{engine}: 2 processes = {total_audio / slowest:.1f} audio-s per wall-s "
            f"(synthesis only; {total_audio / wall2:.1f} incl. start-up)"
        )
        peaks = {}
        for n in sizes:
            r = _result(_child(voice, " ".join([SENTENCE] * n), 1))
            peaks[n] = r["peak"]
            say(f"{engine}: peak RSS {n:>4} sentences = {r['peak']:.0f} MB ({r['audio']:.0f} s audio)")
        big = max(sizes)
        say(f"{engine}: peak RSS growth 10 -> {big} sentences = {100 * (peaks[big] / peaks[10] - 1):+.1f} %")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory():
        run(args.quick)
