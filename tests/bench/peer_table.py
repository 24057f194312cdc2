"""The figures of `make bench-peer`: one row per system and client count, medians over interleaved rounds."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

PEER = "Piper HTTP server"


@dataclass
class Result:
    name: str
    clients: int
    wall: float
    audio_seconds: float
    latencies: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.audio_seconds / self.wall if self.wall else 0.0

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.clients


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


@dataclass
class Tally:
    """What a row's runs cost beyond their latencies: CPU seconds by process, submit -> claimed waits."""

    cpu: dict[tuple[str, int], dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    requests: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    waits: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, key: tuple[str, int], cpu: dict[str, float], requests: int, waits: list[float]) -> None:
        for group, seconds in cpu.items():
            self.cpu[key][group] = self.cpu[key].get(group, 0.0) + seconds
        self.requests[key] += requests
        self.waits[key].extend(waits)

    def cpu_lines(self) -> list[str]:
        lines = []
        for (name, clients), groups in self.cpu.items():
            n = self.requests[(name, clients)]
            per = ", ".join(f"{g} {seconds / n:.3f}" for g, seconds in groups.items())
            lines.append(f"| {name} | {clients} | {per} |")
        return lines

    def wait_lines(self) -> list[str]:
        lines = []
        for (name, clients), waits in self.waits.items():
            label = "dispatch (idle worker)" if clients == 1 else "queue wait"
            lines.append(
                f"| {name} | {clients} | {label} | {len(waits)} | {pct(waits, 50) * 1000:.0f} | "
                f"{pct(waits, 99) * 1000:.0f} |"
            )
        return lines


def _figures(r: Result) -> dict[str, float]:
    return {
        "throughput": r.throughput,
        "p50": pct(r.latencies, 50),
        "p95": pct(r.latencies, 95),
        "p99": pct(r.latencies, 99),
        "ttfb": pct(r.ttfb, 50),
    }


def median_rows(rounds: list[list[Result]]) -> list[str]:
    """One line per row: requests of every round, and the median over rounds of each figure."""
    lines = []
    for same in zip(*rounds, strict=True):
        figures = [_figures(r) for r in same]
        m = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
        lines.append(
            f"| {same[0].name} | {same[0].clients} | {sum(len(r.latencies) for r in same)} | "
            f"{m['throughput']:.2f} | {m['p50']:.2f} | {m['p95']:.2f} | {m['p99']:.2f} | {m['ttfb']:.2f} |"
        )
    return lines


def _ratios(ours: Result, peer: Result) -> tuple[float, float, float, float]:
    peer_p50 = pct(peer.latencies, 50)
    return (
        ours.throughput / peer.throughput,
        pct(ours.latencies, 50) / peer_p50,
        pct(ours.latencies, 95) / pct(peer.latencies, 95),
        pct(ours.ttfb, 50) / peer_p50,
    )


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def ratio_rows(rounds: list[list[Result]]) -> list[str]:
    """Ours / the peer of the same round and client count; median (lowest-highest) over rounds."""
    per: dict[tuple[str, int], list[tuple[float, float, float, float]]] = defaultdict(list)
    for results in rounds:
        peers = {r.clients: r for r in results if r.name == PEER}
        for r in results:
            if r.name.startswith("ours") and r.clients in peers:
                per[r.key].append(_ratios(r, peers[r.clients]))
    return [
        f"| {name} | {clients} | "
        + " | ".join(_spread(list(column)) for column in zip(*values, strict=True))
        + " |"
        for (name, clients), values in per.items()
    ]
