"""Realtime sessions beside batch work: `python -m tests.bench sessions [--quick]`.

A fixed corpus of agent turns (``agent_turns.txt``, 12-19 words each) is spoken through realtime
sessions at 1, 4 and 8 sessions at once, idle and with 100 long batch jobs of another tenant
queued, and side by side the same turns as one streaming ``/v1/audio/speech`` request per
sentence. All through Nginx and TLS, the sentence cache off (``cache: false``), the default
cutting policy with a first unit of at least 24 characters. Timed at the client:

- a session's latency is from sending a turn (``input.text`` with ``flush``) to the first binary
  frame of its first unit; the first unit's audio seconds are reported beside it;
- a request's is from sending it to its first audio byte;
- batch throughput is the characters of batch jobs finished per second during the sessions,
  against the same backlog alone.

Run once per worker layout: the default (``TTS_WORKER_INTERACTIVE_RESERVED`` 1: one job slot of
the two children's two kept for interactive work) and nothing reserved (0), for comparison.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.bench.bench_peer import LONG_TEXTS, VOICE, pct, start_ours

TURNS = [
    line.strip()
    for line in (Path(__file__).with_name("agent_turns.txt")).read_text().splitlines()
    if line.strip()
]
RATE = 24000  # session PCM
FIRST_UNIT_CHARS = 24
BACKLOG = 100


@dataclass
class Cell:
    latencies: list[float] = field(default_factory=list)
    first_unit_seconds: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, latency: float, seconds: float | None = None) -> None:
        with self.lock:
            self.latencies.append(latency)
            if seconds is not None:
                self.first_unit_seconds.append(seconds)


def _session(port: int, key: str, turns: list[str], cell: Cell) -> None:
    from tests.integration.api.session_client import open_session

    with open_session(port, key) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "session.config",
                    "voice": VOICE,
                    "response_format": "pcm",
                    "cache": False,
                    "first_unit_chars": FIRST_UNIT_CHARS,
                }
            )
        )
        while json.loads(ws.recv(timeout=60)).get("type") != "session.ready":
            pass
        for turn in turns:
            sent = time.monotonic()
            ws.send(json.dumps({"type": "input.text", "text": turn, "flush": True}))
            first: float | None = None
            unit_bytes, units_done = 0, 0
            while True:
                message = ws.recv(timeout=120)
                if isinstance(message, bytes):
                    if first is None:
                        first = time.monotonic() - sent
                    if units_done == 0:
                        unit_bytes += len(message)
                    continue
                kind = json.loads(message).get("type")
                if kind == "audio.done":
                    units_done += 1
                elif kind == "session.done":
                    break
                elif kind == "error":
                    raise RuntimeError(message)
            cell.add(first if first is not None else float("nan"), unit_bytes / (2 * RATE))


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.?!])\s+", text) if s]


def _request(base: str, key: str, sentence: str, cell: Cell, http: requests.Session) -> None:
    sent = time.monotonic()
    body = {"model": "tts-1", "voice": VOICE, "input": sentence, "response_format": "pcm", "cache": False}
    headers = {"Authorization": f"Bearer {key}", "X-Stainless-Raw-Response": "stream"}
    with http.post(f"{base}/v1/audio/speech", json=body, headers=headers, stream=True, timeout=300) as r:
        r.raise_for_status()
        first = None
        for _chunk in r.iter_content(chunk_size=None):
            if first is None:
                first = time.monotonic() - sent
    cell.add(first if first is not None else float("nan"))


def _run_sessions(port: int, key: str, clients: int, turns_each: int) -> Cell:
    cell = Cell()
    shares = [[TURNS[(c * turns_each + i) % len(TURNS)] for i in range(turns_each)] for c in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(_session, port, key, share, cell) for share in shares]:
            f.result()
    return cell


def _run_requests(base: str, key: str, clients: int, turns_each: int) -> Cell:
    cell = Cell()

    def client(share: list[str]) -> None:
        with requests.Session() as http:
            http.verify, http.trust_env = False, False
            for turn in share:
                for sentence in _sentences(turn):
                    _request(base, key, sentence, cell, http)

    shares = [[TURNS[(c * turns_each + i) % len(TURNS)] for i in range(turns_each)] for c in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client, share) for share in shares]:
            f.result()
    return cell


def _backlog(org: Any) -> list[Any]:
    from tests.reliability.helpers import submit

    return [submit(org, f"{LONG_TEXTS[i % len(LONG_TEXTS)]} ({i})", voice=VOICE) for i in range(BACKLOG)]


def _drop(jobs: list[Any]) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    for job in SynthesisJob.objects.filter(id__in=[j.id for j in jobs], status="queued"):
        lifecycle.cancel_job(job)
    deadline = time.monotonic() + 300
    while SynthesisJob.objects.filter(id__in=[j.id for j in jobs], status="running").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the backlog's running jobs did not end")
        time.sleep(0.5)


def _batch_chars_done(jobs: list[Any], since: Any) -> int:
    from django.db.models import Sum

    from webapp.speech.models import SynthesisJob

    done = SynthesisJob.objects.filter(
        id__in=[j.id for j in jobs], status="succeeded", finished_at__gte=since
    )
    return int(done.aggregate(n=Sum("text_chars"))["n"] or 0)


def _row(kind: str, clients: int, load: str, cell: Cell, batch: str, waits: list[float]) -> str:
    first = f"{statistics.median(cell.first_unit_seconds):.2f}" if cell.first_unit_seconds else "-"
    wait = f"{pct(waits, 95) * 1000:.0f}" if waits else "-"
    return (
        f"| {kind} | {clients} | {load} | {len(cell.latencies)} | {pct(cell.latencies, 50) * 1000:.0f} | "
        f"{pct(cell.latencies, 95) * 1000:.0f} | {wait} | {first} | {batch} |"
    )


def _queue_waits(org: Any, since: Any) -> list[float]:
    """Seconds each interactive job of ``org`` since ``since`` waited between its submit and its claim:
    what the lanes decide (the rest of the first audio's time is rendering and relaying)."""
    from webapp.speech.models import SynthesisJob

    rows = SynthesisJob.objects.filter(
        organization=org, created_at__gte=since, started_at__isnull=False, lane="interactive"
    ).values_list("created_at", "started_at")
    return [(started - created).total_seconds() for created, started in rows if started is not None]


def _turns(clients: int, turns_each: int) -> int:
    """Turns per session: one session speaks 16 (its p95 is then not just its slowest turn)."""
    return turns_each * 4 if clients == 1 else turns_each


def _layout(stack: Any, reserved: str) -> None:
    from django.conf import settings

    stack.stop_service(next(s for s in stack.sup.services if s.name == "worker"))
    stack.start_worker(
        "worker",
        concurrency=str(settings.TTS_WORKER_CONCURRENCY),
        env={"DJANGO_DEBUG": "0", "TTS_WORKER_INTERACTIVE_RESERVED": reserved},
        timeout=300,
    )


def run(quick: bool) -> list[str]:
    turns_each = 2 if quick else 4
    clients_list = (1, 4) if quick else (1, 4, 8)
    stack, base, key, _org = start_ours()  # first: it sets up Django with the test settings
    from django.utils import timezone

    from tests.reliability.helpers import make_org

    port = int(stack.cfg.https_port)
    lines: list[str] = []
    try:
        for reserved in ("0", "1"):
            _layout(stack, reserved)
            batch_org = make_org(f"bench-backlog-{reserved}-{time.time_ns()}")
            # The backlog alone, for its throughput.
            jobs = _backlog(batch_org)
            time.sleep(5)  # the workers take their first batch jobs
            since, started = timezone.now(), time.monotonic()
            time.sleep(20 if quick else 40)
            alone = _batch_chars_done(jobs, since) / (time.monotonic() - started)
            _drop(jobs)
            lines += [
                "",
                f"TTS_WORKER_INTERACTIVE_RESERVED={reserved}; batch alone: {alone:.0f} characters/s.",
                "",
                "| path | sessions / clients | load | turns or sentences | first audio p50 ms | p95 ms | "
                "queue wait p95 ms | first unit s | batch chars/s (share of alone) |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for clients in clients_list:
                for load in ("idle", "backlog"):
                    jobs = _backlog(batch_org) if load == "backlog" else []
                    if jobs:
                        time.sleep(5)
                    for kind, runner in (("session", _run_sessions), ("/v1/audio/speech", None)):
                        since, started = timezone.now(), time.monotonic()
                        if runner is not None:
                            cell = runner(port, key, clients, _turns(clients, turns_each))
                        else:
                            cell = _run_requests(base, key, clients, _turns(clients, turns_each))
                        batch = "-"
                        if jobs:
                            rate = _batch_chars_done(jobs, since) / (time.monotonic() - started)
                            batch = f"{rate:.0f} ({rate / alone:.0%})" if alone else f"{rate:.0f}"
                        lines.append(_row(kind, clients, load, cell, batch, _queue_waits(_org, since)))
                        print(lines[-1], flush=True)
                    if jobs:
                        _drop(jobs)
    finally:
        stack.stop_all()
    return lines
