"""The arithmetic `make bench-peer` prints against the raw limit (tests/bench/peer_table.py)."""

from __future__ import annotations

from tests.bench.peer_table import CLIENT, PEER, Ceiling, Result, Tally, ceiling_lines

PATH = "ours /v1/audio/speech"


def _row(name: str, clients: int, throughput: float, p50: float) -> Result:
    # Ten requests, all at p50: wall 10 s, so audio seconds = throughput * 10.
    return Result(name, clients, 10.0, throughput * 10, latencies=[p50] * 10, ttfb=[p50] * 10)


def _round(peer_8: float, ours_1_p50: float) -> list[Result]:
    return [
        _row(PEER, 1, 24.0, 0.170),
        _row(PATH, 1, 18.0, ours_1_p50),
        _row(PEER, 8, peer_8, 1.4),
        _row(PATH, 8, 19.0, 1.6),
    ]


def _ceiling(layout: float) -> Ceiling:
    c = Ceiling()
    for _ in range(3):
        c.layout.append(_row("raw engine, worker layout (2 x 1 thread)", 2, layout, 0.3))
        c.solo.append(_row("raw engine", 1, 22.0, 0.180))
        c.raw_cpu.append(0.300)
    return c


def _tally(worker: float, web: float, client: float = 0.0) -> Tally:
    t = Tally()
    ours = {"worker": worker * 30, "gunicorn": web * 30, "piper.http_server": 5.0, CLIENT: client * 30}
    t.add((PATH, 8), ours, 30, [])
    t.add((PEER, 8), {CLIENT: 0.004 * 30, "piper.http_server": 0.37 * 30}, 30, [])
    return t


def test_it_gives_the_cpu_budget_the_layout_leaves_and_what_we_spend() -> None:
    rounds = [_round(24.0, 0.230) for _ in range(3)]
    lines = ceiling_lines(rounds, _ceiling(27.6), _tally(worker=0.36, web=0.025, client=0.014), PATH)
    text = "\n".join(lines)
    # 27.6 / 24 = 1.15: 0.3 * 0.15 = 0.045 CPU-s may be spent beyond the engine's 0.300.
    assert "1.15 x (1.15-1.15) the peer's throughput at 0.300 CPU-s per request" in text
    assert "may spend 0.045 CPU-s per request beyond the engine; it spends 0.095" in text
    # The worker's share beyond the engine (0.36 - 0.30) and the client's beyond the peer's client
    # (0.014 - 0.004) are named; the idle peer is not counted.
    assert "worker beyond the engine 0.060, gunicorn 0.025, bench client beyond the peer's 0.010" in text
    assert "piper.http_server" not in text
    assert "cannot be reached" in text
    # 1 client: 1.15 * 170 ms - 180 ms = 15.5 ms allowed; ours 230 - 180 = 50 ms.
    assert "leaves 16 ms for everything around it; ours takes 50 ms more" in text


def test_it_says_when_the_budget_holds() -> None:
    rounds = [_round(20.0, 0.190) for _ in range(3)]
    text = "\n".join(ceiling_lines(rounds, _ceiling(27.0), _tally(worker=0.32, web=0.02, client=0.004), PATH))
    # 27 / 20 = 1.35: budget 0.105; spent 0.02 + 0.02 = 0.04.
    assert "may spend 0.105 CPU-s per request beyond the engine; it spends 0.040" in text
    assert "1.0 x can be reached" in text
