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
import time
from typing import Any

from tests.bench.peer_table import Result

EXIT_TIMEOUT = 30


def child(threads: int, requests_total: int, offset: int) -> None:
    from tests.bench.bench_peer import TEXTS, load_raw_engine, raw_engine

    synth = load_raw_engine(threads)
    raw_engine(synth, len(TEXTS))  # the same warm-up for every process
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()
    result = raw_engine(synth, requests_total, offset)
    cpu = time.process_time() - cpu
    figures = {"latencies": result.latencies, "audio_seconds": result.audio_seconds, "cpu_seconds": cpu}
    print(json.dumps(figures), flush=True)


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
