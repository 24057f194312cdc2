"""Streaming multi-sentence texts: `python -m tests.bench stream [--quick]`.

The texts of ``bench_peer`` three sentences at a time (about 15 s of audio
each), so the first sentence's audio can leave before the job is done. Prints,
in one run: Piper's own server's whole latency on the same texts, our
streaming ``/v1/audio/speech`` (time to first byte and whole latency) with 1
and 4 clients, and the CPU seconds per streamed request of the web tier
(gunicorn) and of PostgreSQL, which is what waiting on a stream costs.
"""

from __future__ import annotations

from typing import Any

from tests.bench.bench_peer import (
    LONG_TEXTS,
    SENTENCES,
    cpu_seconds,
    openai_request,
    pct,
    peer_request,
    process_groups,
    run_clients,
    start_ours,
    start_peer,
)


def _row(name: str, result: Any, cpu: dict[str, float] | None = None) -> str:
    n = len(result.latencies)
    spent = (
        ", ".join(f"{g} {v / n:.3f}" for g, v in cpu.items() if g in ("gunicorn", "postgres", "redis"))
        if cpu
        else ""
    )
    return (
        f"| {name} | {result.clients} | {n} | {pct(result.ttfb, 50):.2f} | {pct(result.latencies, 50):.2f} | "
        f"{pct(result.latencies, 95):.2f} | {spent} |"
    )


def run(quick: bool) -> list[str]:
    n = 8 if quick else 16
    lines = [
        f"Texts of {SENTENCES} sentences; whole latency for the peer, first byte and whole for ours.",
        "",
        "| system | clients | requests | first byte p50 s | p50 s | p95 s | cpu-s/request |",
        "|---|---|---|---|---|---|---|",
    ]
    peer = start_peer()
    stack = None
    try:
        lines.append(_row("Piper HTTP server", run_clients("peer", 1, n, peer_request, texts_of=LONG_TEXTS)))
        peer.terminate()
        peer.wait(30)
        stack, base, key, _org = start_ours()
        auth = {"Authorization": f"Bearer {key}"}
        for clients in (1, 4):
            groups = process_groups(stack, None)
            before = cpu_seconds(groups)
            result = run_clients(
                "ours",
                clients,
                n,
                lambda s, t: openai_request(s, base, t, stream=True),
                auth,
                texts_of=LONG_TEXTS,
            )
            after = cpu_seconds(groups)
            spent = {g: after[g] - before[g] for g in after if g in before}
            lines.append(_row("ours /v1/audio/speech streaming", result, spent))
    finally:
        if peer.poll() is None:
            peer.kill()
        if stack is not None:
            stack.stop_all()
    for line in lines:
        print(line)
    return lines
