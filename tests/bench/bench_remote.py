"""The remote path's overhead per unit: `python -m tests.bench remote [--quick]`.

One sentence (a session's or an agent's unit) spoken by a remote model (synth/engines/remote.py),
two ways, interleaved in one run against the same upstream (the fake vLLM-Omni server of
tests/upstream, eSpeak audio, one replica):

- **direct**: ``POST /v1/audio/speech`` (streamed PCM) to the upstream itself, as a client
  without this service would call it;
- **through this service**: the same request to ``/v1/audio/speech`` through Nginx and TLS, the
  job relayed by a remote worker (one child, the models file's defaults).

Printed: time to first byte and whole latency (p50, p95) of each, the time to first byte this
service adds, and the CPU milliseconds per unit of each of its processes (gunicorn, the worker,
Nginx, PostgreSQL, Redis) over the run, less what they spend idle over as long.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from tests.bench.bench_peer import TEXTS, cpu_seconds, pct, process_groups
from tests.bench.bench_worker import _setup

MODEL = "cosyvoice3"
VOICE = f"{MODEL}:alloy"
SERVICES = ("gunicorn", "worker-remote", "nginx", "postgres", "redis")


def _texts(n: int) -> list[str]:
    """``n`` different sentences: a repeated one would be the sentence cache's, not the upstream's."""
    return [f"{TEXTS[i % len(TEXTS)][:-1]}, number {i}." for i in range(n)]


def _timed(response: requests.Response, started: float) -> tuple[float, float, int]:
    first, size = 0.0, 0
    for chunk in response.iter_content(chunk_size=None):
        first = first or time.monotonic() - started
        size += len(chunk)
    response.raise_for_status()
    return first, time.monotonic() - started, size


def _direct(session: requests.Session, upstream: str, text: str) -> tuple[float, float, int]:
    body = {"model": MODEL, "voice": "alloy", "input": text, "response_format": "pcm", "stream": True}
    body["stream_format"] = "audio"  # raw PCM as it comes (vLLM-Omni's default for a stream is SSE)
    started = time.monotonic()
    return _timed(session.post(f"{upstream}/v1/audio/speech", json=body, stream=True, timeout=60), started)


def _ours(session: requests.Session, base: str, text: str) -> tuple[float, float, int]:
    body = {"model": MODEL, "voice": VOICE, "input": text, "response_format": "pcm", "stream_format": "audio"}
    started = time.monotonic()
    return _timed(session.post(f"{base}/v1/audio/speech", json=body, stream=True, timeout=60), started)


def _start(models_file: Path) -> tuple[Any, str, str]:
    """The test stack with one remote worker (one child), gunicorn and Nginx (limits raised), and a key."""
    for key, value in {
        "RATE_GENERAL": "10000r/s",
        "BURST_GENERAL": "10000",
        "RATE_WRITE": "10000r/s",
    }.items():
        os.environ[f"TTS_NGINX_{key}"] = value  # this run's Nginx only
    os.environ["TTS_REMOTE_MODELS_FILE"] = str(models_file)  # this process syncs the model's voices
    stack, _owned = _setup()
    from django.core.management import call_command

    from synth.registry import list_voices
    from webapp.speech.voices import sync_builtin_voices

    call_command("collectstatic", "--noinput", verbosity=0)
    sync_builtin_voices(list_voices(engines=[MODEL]))
    production = {"DJANGO_DEBUG": "0"}  # the suite's stack runs with DEBUG
    try:
        stack.start_worker(
            "worker-remote",
            queues=f"synth.{MODEL}",
            concurrency="1",
            env={
                **production,
                "DJANGO_SETTINGS_MODULE": "webapp.settings",
                "TTS_WORKER_ENGINES": MODEL,
                "TTS_REMOTE_MODELS_FILE": str(models_file),
            },
            timeout=120,
        )
        stack.start_web(env=production)
    except BaseException:
        stack.stop_all()
        raise
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    limits = {"requests_per_minute": 100000, "max_concurrent_jobs": 1000, "monthly_characters": 10**9}
    plan = Plan.objects.create(slug=f"bench-remote-{time.time_ns()}", name="bench remote", **limits)
    org = create_organization(f"bench remote {time.time_ns()}", plan=plan)
    _key, raw = create_api_key(org, "bench", created_by=OPERATOR, scopes=["speech:read", "speech:write"])
    return stack, f"https://127.0.0.1:{stack.cfg.https_port}", raw


def _spent(groups: dict[str, list[Any]], seconds: float) -> dict[str, float]:
    before = cpu_seconds(groups)
    time.sleep(seconds)
    after = cpu_seconds(groups)
    return {g: after[g] - before[g] for g in after if g in before}


def run(quick: bool) -> list[str]:
    # The test stack's settings: importing deploy.stack (through the harness) defaults them to
    # webapp.settings, whose database is `make run`'s.
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    from tests.upstream.harness import prepare_clients, start_upstream

    n = 12 if quick else 40
    prepare_clients()
    folder = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    upstream = start_upstream(folder / "upstream.log", "--replica", "bench", "--model", MODEL)
    models_file = folder / "remote-models.json"
    model = {"upstreams": [upstream.url], "voices": [{"id": "alloy", "language": "en-us"}]}
    models_file.write_text(json.dumps({"models": {MODEL: model}}))
    stack = None
    try:
        stack, base, key = _start(models_file)
        direct, ours = requests.Session(), requests.Session()
        for session in (direct, ours):
            session.trust_env = False
        ours.verify = False
        ours.headers["Authorization"] = f"Bearer {key}"
        for text in _texts(3):  # warm: connections, the worker's first claim
            _direct(direct, upstream.url, text)
            _ours(ours, base, text)
        groups = process_groups(stack, None)
        started = time.monotonic()
        times: dict[str, list[tuple[float, float, int]]] = {"direct": [], "ours": []}
        before = cpu_seconds(groups)
        for text in _texts(n):
            times["direct"].append(_direct(direct, upstream.url, text))
            times["ours"].append(_ours(ours, base, text))
        after = cpu_seconds(groups)
        elapsed = time.monotonic() - started
        busy = {g: after[g] - before[g] for g in after if g in before}
        idle = _spent(groups, min(elapsed, 20.0))
        idle_rate = {g: v / min(elapsed, 20.0) for g, v in idle.items()}
        per_unit = {g: max(0.0, busy[g] - idle_rate.get(g, 0.0) * elapsed) * 1000 / n for g in busy}
    finally:
        upstream.stop()
        if stack is not None:
            stack.stop_all()
    lines = [
        f"One sentence per request, {n} of each, interleaved, 1 client; the upstream is tests/upstream "
        "(eSpeak), one replica; ours through Nginx and TLS, one remote worker child.",
        "",
        "| path | first byte p50 ms | p95 ms | whole p50 ms | p95 ms | audio bytes p50 |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows in times.items():
        first, whole, size = ([r[i] for r in rows] for i in range(3))
        lines.append(
            f"| {name} | {pct(first, 50) * 1000:.0f} | {pct(first, 95) * 1000:.0f} | "
            f"{pct(whole, 50) * 1000:.0f} | {pct(whole, 95) * 1000:.0f} | {pct([float(s) for s in size], 50):.0f} |"
        )
    added = [o[0] - d[0] for d, o in zip(times["direct"], times["ours"], strict=True)]
    lines += [
        "",
        f"Added time to first byte per unit: p50 {pct(added, 50) * 1000:.0f} ms, p95 {pct(added, 95) * 1000:.0f} ms.",
        "CPU ms per unit through this service (less idle): "
        + ", ".join(f"{g} {per_unit[g]:.1f}" for g in SERVICES if g in per_unit)
        + "; the upstream itself (direct and relayed requests): not counted.",
    ]
    for line in lines:
        print(line)
    return lines
