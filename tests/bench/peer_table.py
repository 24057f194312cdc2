"""The figures of `make bench-peer`: one row per system and client count, medians over interleaved rounds."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

PEER = "Piper HTTP server"
CLIENT = "bench client + raw engine"  # the benchmark's own process


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
            if not waits:  # the peer's rows: no jobs of ours
                continue
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


@dataclass
class Ceiling:
    """What the raw engine allows us against the peer, and what our stack spends beyond it.

    ``layout``: the raw engine in the worker's layout (tests/bench/raw_layout.py), one per round;
    ``solo``: the raw engine alone in one process (a lone request's session), one per round;
    ``raw_cpu``: CPU seconds per request of the layout rows, one per round.
    """

    layout: list[Result] = field(default_factory=list)
    solo: list[Result] = field(default_factory=list)
    raw_cpu: list[float] = field(default_factory=list)


P50_TARGET = 1.15  # 1 client: our p50 at most this times the peer's


def ceiling_lines(rounds: list[list[Result]], ceiling: Ceiling, tally: Tally, path: str) -> list[str]:
    """The targets against the raw limit of this machine, and where our CPU per request goes.

    At the top client count the machine's cores are the limit: throughput is inversely
    proportional to the CPU seconds a request costs. The layout's raw throughput over the peer's
    says how much CPU per request our stack may spend beyond the engine's own and still match the
    peer; the tally says what it spends. With one client, the lone raw engine's p50 and the
    peer's say how many milliseconds the rest of the pipeline may take.
    """
    top = max(r.clients for r in rounds[0])
    peers = [next(r for r in results if r.name == PEER and r.clients == top) for results in rounds]
    ratios = [lay.throughput / peer.throughput for lay, peer in zip(ceiling.layout, peers, strict=True)]
    ratio, raw_cpu = statistics.median(ratios), statistics.median(ceiling.raw_cpu)
    budget = raw_cpu * (ratio - 1)
    groups = tally.cpu.get((path, top), {})
    n = tally.requests.get((path, top), 0) or 1
    spent = {g: s / n for g, s in groups.items() if g != "piper.http_server"}
    if "worker" in spent:
        spent["worker"] -= raw_cpu  # the engine's own share is what the layout row spent
    # The peer's rows have a client on the same cores too: only what ours costs beyond it counts.
    peer_groups, peer_n = tally.cpu.get((PEER, top), {}), tally.requests.get((PEER, top), 0)
    if CLIENT in spent and CLIENT in peer_groups and peer_n:
        spent[CLIENT] -= peer_groups[CLIENT] / peer_n
    beyond = sum(spent.values())
    names = {"worker": "worker beyond the engine", CLIENT: "bench client beyond the peer's"}
    by_group = ", ".join(
        f"{names.get(g, g)} {s:.3f}" for g, s in sorted(spent.items(), key=lambda kv: -kv[1])
    )
    lone = [
        (next(r for r in results if r.name == PEER and r.clients == 1), solo, ours)
        for results, solo in zip(rounds, ceiling.solo, strict=True)
        for ours in results
        if ours.name == path and ours.clients == 1
    ]
    allowed = statistics.median(P50_TARGET * pct(p.latencies, 50) - pct(s.latencies, 50) for p, s, _ in lone)
    taken = statistics.median(pct(o.latencies, 50) - pct(s.latencies, 50) for _, s, o in lone)
    reachable = "can" if ratio >= 1 and beyond <= budget else "cannot"
    return [
        f"Against the raw limit ({path}; medians over the rounds):",
        "",
        f"- {top} clients: the {ceiling.layout[0].name} gives "
        f"{ratio:.2f} x ({min(ratios):.2f}-{max(ratios):.2f}) the peer's throughput at "
        f"{raw_cpu:.3f} CPU-s per request. To match the peer, the rest of our stack may spend "
        f"{max(budget, 0.0):.3f} CPU-s per request beyond the engine; it spends {beyond:.3f} "
        f"({by_group}), so 1.0 x {reachable} be reached this way on this machine.",
        f"- 1 client: the raw engine alone answers in {pct(ceiling.solo[0].latencies, 50) * 1000:.0f} ms "
        f"(p50, first round); {P50_TARGET:.2f} x the peer's p50 leaves {allowed * 1000:.0f} ms for "
        f"everything around it; ours takes {taken * 1000:.0f} ms more than the raw engine.",
    ]
