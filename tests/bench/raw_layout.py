"""The raw engine in the worker's layout: what `make bench-peer` compares the peer's throughput with.

The peer is one process whose requests share one onnxruntime session; our worker runs
``TTS_WORKER_CONCURRENCY`` children of ``TTS_WORKER_THREADS`` inference threads each. This module
runs that many processes of ``synth.Synthesizer`` with those threads side by side over the same
texts, with nothing of our stack in the way: the most audio per second our layout can give on
this machine. Each process loads and warms up, says ``ready``, waits for ``go`` on its stdin,
synthesises its share and prints its figures as one JSON line.

Run as a child: ``python -m tests.bench.raw_layout THREADS REQUESTS OFFSET``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from typing import Any

from tests.bench.peer_table import Result

EXIT_TIMEOUT = 30


def child(threads: int, requests_total: int, offset: int) -> None:
    from synth import SynthesisRequest, Synthesizer
    from tests.bench.bench_peer import TEXTS, VOICE

    synth = Synthesizer(engines=["piper"], threads=threads)
    synth.load([VOICE])
    synth.warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(TEXTS):  # the same warm-up for every process
            synth.synthesize(SynthesisRequest(text=text, voice=VOICE), f"{tmp}/warm{i}.wav")
        print("ready", flush=True)
        sys.stdin.readline()
        latencies, audio = [], 0.0
        cpu = time.process_time()
        for i in range(requests_total):
            t0 = time.monotonic()
            text = TEXTS[(offset + i) % len(TEXTS)]
            r = synth.synthesize(SynthesisRequest(text=text, voice=VOICE), f"{tmp}/{i}.wav")
            latencies.append(time.monotonic() - t0)
            audio += r.duration_seconds
        cpu = time.process_time() - cpu
    print(json.dumps({"latencies": latencies, "audio_seconds": audio, "cpu_seconds": cpu}), flush=True)


def run_layout(processes: int, threads: int, requests_total: int) -> tuple[Result, float]:
    """``requests_total`` requests over ``processes`` processes of ``threads`` threads, started together.

    Returns the row (clients = processes) and the CPU seconds per request they spent.
    """
    share = [requests_total // processes + (i < requests_total % processes) for i in range(processes)]
    command = [sys.executable, "-W", "ignore", "-m", "tests.bench.raw_layout", str(threads)]
    procs = [
        subprocess.Popen([*command, str(n), str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for i, n in enumerate(share)
    ]
    done = False
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"raw layout process {p.pid} did not start")
        started = time.monotonic()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        figures: list[dict[str, Any]] = []
        for p in procs:
            assert p.stdout is not None
            figures.append(json.loads(p.stdout.readline()))
        wall = time.monotonic() - started
        done = True
    finally:
        for p in procs:
            if not done:
                p.kill()
            try:
                p.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    result = Result(layout_name(processes, threads), processes, wall, 0.0)
    for f in figures:
        result.latencies.extend(f["latencies"])
        result.ttfb.extend(f["latencies"])
        result.audio_seconds += f["audio_seconds"]
    return result, sum(f["cpu_seconds"] for f in figures) / requests_total


def layout_name(processes: int, threads: int) -> str:
    return f"raw engine, worker layout ({processes} x {threads} thread{'s' if threads > 1 else ''})"


if __name__ == "__main__":
    child(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
