"""CPU of the web tier's per-request reads, one query each: `python -m tests.bench queries [--quick]`.

Each read runs N times in a loop (500; 100 with ``--quick``) in this process
against the test stack's PostgreSQL, no HTTP; the figure is milliseconds of
this process's CPU per call (``time.process_time``, so PostgreSQL's own time
is not in it), the best of three rounds, since a shared machine's load drifts.

* key lookup: ``find_api_key`` (every authenticated request: the key with its
  tenant, plan and holder's role; two HMACs included);
* job read: ``queries.job_row`` of a tenant's job (every job GET, long-poll
  answer, stream and download) and without the tenant (a waiter's answer);
* voice: ``queries.visible_voice`` (every submit);
* queue ETA: ``eta.estimate`` of a queued job with its basis given (every
  answer about a queued job: the position and wait aggregate);
* OpenAI audio: ``openai.deliver`` of a finished job (every /v1/audio/speech
  answer: the row read and the response built from a small file);
* operations figures: ``operations.job_figures`` (the operations page and the
  per-minute snapshot; not per request).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench.bench_worker import _setup, _voices

ROUNDS = 3


def cpu_ms_per_call(call: Callable[[], Any], n: int) -> float:
    """CPU milliseconds of this process per call of ``call``: the best of ROUNDS loops of ``n``."""
    call()  # warm: the connection, caches built on first use
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(n):
            call()
        best = min(best, (time.process_time() - started) / n * 1000)
    return best


def _rows() -> tuple[dict[str, Any], Callable[[], None]]:
    """A tenant, its key and jobs to read; and what removes them again."""
    from django.conf import settings
    from django.utils import timezone

    from tests.reliability.helpers import ESPEAK, make_org
    from webapp.speech.models import SynthesisJob, Voice
    from webapp.tenants.services import OPERATOR, create_api_key

    org = make_org(f"bench-queries-{time.time_ns()}")
    _, raw = create_api_key(org, "bench", created_by=OPERATOR)
    voice = Voice.objects.get(voice_id=ESPEAK)
    engine = f"benchq{time.time_ns() % 10**6}"  # no real job or worker of this engine
    now = timezone.now()
    media = Path(settings.MEDIA_ROOT)
    relative = f"bench-queries-{time.time_ns()}.wav"
    (media / relative).parent.mkdir(parents=True, exist_ok=True)
    (media / relative).write_bytes(b"RIFF" + b"\0" * 2000)

    def job(status: str, minutes_ago: float, **fields: Any) -> Any:
        at = now - dt.timedelta(minutes=minutes_ago)
        return SynthesisJob.objects.create(
            organization=org,
            voice=voice,
            voice_name=voice.voice_id,
            engine=engine,
            text="Benchmark text.",
            text_chars=15,
            format="wav",
            params={"speed": 1.0},
            status=status,
            created_at=at,
            queued_at=at,
            **fields,
        )

    for i in range(5):
        job(SynthesisJob.Status.QUEUED, 10 - i)
    job(SynthesisJob.Status.RUNNING, 12, progress=0.5)
    queued = job(SynthesisJob.Status.QUEUED, 1)
    done = job(
        SynthesisJob.Status.SUCCEEDED,
        20,
        finished_at=now,
        audio_path=relative,
        audio_bytes=2004,
        metrics={"queue_ms": 12, "rtf": 0.1, "device": "cpu", "synth_ms": 100},
    )

    def remove() -> None:
        SynthesisJob.objects.filter(organization=org).delete()
        org.delete()
        (media / relative).unlink(missing_ok=True)

    return {"org": org, "raw": raw, "voice": voice.voice_id, "queued": queued, "done": done}, remove


def measure(n: int) -> list[str]:
    from django.utils import timezone

    from webapp.speech import operations
    from webapp.speech.api import openai
    from webapp.speech.services import eta, queries
    from webapp.tenants.services import find_api_key

    rows, remove = _rows()
    org, queued, done = rows["org"], rows["queued"], rows["done"]
    basis = eta.EtaBasis(0.01, 1, {"cpu": 1})
    since = timezone.now() - dt.timedelta(hours=1)
    assert find_api_key(rows["raw"]) is not None
    assert eta.estimate(queued, basis)[1] == 5
    assert openai.deliver(done.pk).status_code == 200
    reads: dict[str, Callable[[], Any]] = {
        "key lookup (find_api_key)": lambda: find_api_key(rows["raw"]),
        "job read of a tenant (job_row)": lambda: queries.job_row(queued.pk, org.pk),
        "job read (job_row)": lambda: queries.job_row(queued.pk),
        "voice (visible_voice)": lambda: queries.visible_voice(org, rows["voice"]),
        "queue ETA (estimate)": lambda: eta.estimate(queued, basis),
        "OpenAI audio (deliver)": lambda: openai.deliver(done.pk).close(),
        "operations figures (job_figures)": lambda: operations.job_figures(since),
    }
    lines = [f"| read ({n} calls, best of {ROUNDS}) | ms CPU per call |", "|---|---|"]
    try:
        for name, call in reads.items():
            lines.append(f"| {name} | {cpu_ms_per_call(call, n):.3f} |")
            print(lines[-1], flush=True)
    finally:
        remove()
    return lines


def run(quick: bool) -> list[str]:
    import os

    os.environ["DJANGO_DEBUG"] = "0"  # production settings: DEBUG would also log every query
    stack, owned = _setup()
    try:
        _voices()
        return measure(100 if quick else 500)
    finally:
        if owned:
            stack.stop_all()
