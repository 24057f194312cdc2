"""Two tenants beside the soak's own (issue 48): nobody's webhooks wait on a receiver that never
answers, and a stream that fails partway pays for what it handed.

- The soak's tenant (every soak job) sends its events to a receiver that accepts connections and
  never answers; the **hooks** tenant runs one job per ``HOOK_EVERY`` soak jobs, and its
  ``job.succeeded`` events go to a receiver that answers at once. Each of those must arrive, at the
  latency of an idle service, whatever the other tenant's backlog.
- The **failing** tenant streams ``failing_text(k)`` from ``/v1/audio/speech`` once per
  ``FAILING_EVERY`` soak jobs; the worker burns CPU after each sentence of it
  (``TTS_FAULT_BURN_CPU_MARKER``, tests/faults.py) past the soak's lowered CPU limit
  (``TTS_JOB_BASE_SECONDS``), so the job fails partway through its stream, by the real limit. Each
  must be charged the characters of the sentences its stream handed, more than none and less than
  its text. One whose worker child the soak kills midway ends canceled instead (its stream broke,
  the client left), charged the same way; at least one must fail by the limit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from deploy.provision import StackConfig
from tests.e2e.local_stack import StackProcess, api_session, submit_until_accepted
from tests.webhook_receiver import Receiver, receiving

ROOT = Path(__file__).resolve().parents[2]
HOOK_EVERY = 25
FAILING_EVERY = 100
BURN_MARKER = "Burnmarker"
# Ten sentences; the fault burns a second of CPU after each, the limit allows a few seconds.


def failing_text(k: int) -> str:
    """Ten sentences, their own to stream ``k``: none is in the sentence cache from an earlier stream
    (a cached sentence costs no CPU, and a stream made of them would not fail)."""
    return " ".join(
        f"Sentence {n} of {BURN_MARKER} text {k:03d} that the lowered CPU limit cuts short."
        for n in range(1, 11)
    )


ENV = {
    "TTS_WEBHOOK_ALLOW_PRIVATE": "127.0.0.0/8",
    "TTS_WORKER_HOOKS": "tests.faults",
    "TTS_FAULT_BURN_CPU_MARKER": BURN_MARKER,
    "TTS_FAULT_BURN_CPU_SECONDS": "1.0",
    # A soak job of one sentence spends a few hundredths of a CPU second; the budget is 2 s and a
    # few milliseconds a character (times the inference threads: one, whatever the machine).
    "TTS_JOB_BASE_SECONDS": "2",
    "TTS_JOB_SECONDS_PER_CHAR": "0.002",
    "TTS_WORKER_SOLO_THREADS": "1",
}
MAKE_TENANTS = """
import json
from django.contrib.auth import get_user_model
from webapp.tenants.models import ApiKey
from webapp.tenants.services import create_api_key, create_organization
admin = get_user_model().objects.get(username="admin")
keys = {}
for slug in ("soak-hooks", "soak-failing"):
    org = create_organization(slug, owner=admin, slug=slug)
    keys[slug] = create_api_key(org, "soak", created_by=admin, scopes=ApiKey.ALL_SCOPES)[1]
print(json.dumps(keys))
"""


@dataclass
class SideResult:
    hook_jobs: int = 0
    hook_events: int = 0
    hook_latencies: list[float] = field(default_factory=list)  # seconds from the job's end to arrival
    black_hole_attempts: int = 0  # the soak tenant's attempts at the receiver that never answers
    black_hole_delivered: int = 0
    failing_jobs: int = 0
    # job: (status, charged characters, characters its stream handed, text characters)
    failing: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lat = sorted(self.hook_latencies)
        p50 = statistics.median(lat) if lat else float("nan")
        return [
            f"soak: webhooks: {self.hook_events}/{self.hook_jobs} events of the hooks tenant arrived, "
            f"latency p50 {p50:.2f} s, max {max(lat, default=float('nan')):.2f} s, while the soak tenant's "
            f"receiver never answered ({self.black_hole_attempts} attempts, {self.black_hole_delivered} "
            "delivered)",
            f"soak: {self.failing_jobs} streams cut partway ({self.failed_by_the_limit()} by the CPU limit): "
            + ", ".join(f"{s} charged {c} of {t} for {h} handed" for s, c, h, t in self.failing.values()),
        ]

    def charged_other_than_handed(self) -> list[str]:
        return [
            f"{job}: {status}, charged {charged}, handed {handed}, text {text}"
            for job, (status, charged, handed, text) in self.failing.items()
            if status not in ("failed", "canceled") or charged != handed or handed >= text
        ]

    def failed_by_the_limit(self) -> int:
        """Streams that ended failed. The others were canceled: a child killed by the soak under them
        broke the stream (a new attempt cannot continue it) and the client left, paying as handed."""
        return sum(1 for status, *_ in self.failing.values() if status == "failed")

    def failed_after_streaming(self) -> int:
        """Streams that handed sentences and then failed: the case the soak is about. A stream whose
        first sentence already ran past the limit fails with nothing handed and nothing charged, which
        is right but proves nothing, so at least one must have handed some."""
        return sum(1 for status, _, handed, _ in self.failing.values() if status == "failed" and handed > 0)


def _django_env(stack: StackProcess) -> dict[str, str]:
    """What the stack gives its Django processes (its database and Redis, with their passwords)."""
    cfg = dataclasses.replace(
        StackConfig.from_env(),
        var_dir=stack.var,
        pg_port=int(stack.ports["TTS_PG_PORT"]),
        redis_port=int(stack.ports["TTS_REDIS_PORT"]),
    )
    return {"DATABASE_URL": cfg.database_url, "REDIS_URL": cfg.redis_url}


def _make_tenants(stack: StackProcess) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", MAKE_TENANTS],
        cwd=ROOT,
        env={**stack.env, **_django_env(stack), "TTS_LOG_TO_FILE": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    keys: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return keys


def _endpoint(stack: StackProcess, session: requests.Session, url: str) -> str:
    """A webhook endpoint for job.succeeded; its secret."""
    created = session.post(stack.url("/api/v1/webhooks"), json={"url": url, "events": ["job.succeeded"]})
    assert created.status_code == 201, created.text[:300]
    return str(created.json()["secret"])


def _stream_to_its_end(stack: StackProcess, key: str, idempotency_key: str, text: str) -> None:
    body = {"model": "tts-1", "voice": "espeak-en-us", "input": text, "response_format": "pcm"}
    headers = {"Idempotency-Key": idempotency_key, "X-Stainless-Raw-Response": "stream"}
    for _ in range(30):  # through an outage, if one is under way
        with contextlib.suppress(requests.RequestException):
            with api_session(key).post(
                stack.url("/v1/audio/speech"), json=body, headers=headers, stream=True, timeout=60
            ) as response:
                if response.status_code == 200:
                    with contextlib.suppress(requests.RequestException):
                        for _chunk in response.iter_content(65536):
                            pass
                    return
        time.sleep(2)


class SideTenants:
    """Started beside the soak's tenant; ``on_submitted`` after each soak job, ``finish`` at the end."""

    def __init__(self, stack: StackProcess, soak_key: str) -> None:
        self.stack = stack
        self._exit = contextlib.ExitStack()
        self.receiver: Receiver = self._exit.enter_context(receiving())
        hole = self._exit.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        hole.bind(("127.0.0.1", 0))
        hole.listen(1024)  # accepted by the kernel, never by anyone: no answer ever comes
        keys = _make_tenants(stack)
        _endpoint(stack, api_session(soak_key), f"http://127.0.0.1:{hole.getsockname()[1]}/hole")
        self.hooks_session = api_session(keys["soak-hooks"])
        self.receiver.secrets["hooks"] = _endpoint(stack, self.hooks_session, self.receiver.url("hooks"))
        self.failing_key = keys["soak-failing"]
        self.pool = concurrent.futures.ThreadPoolExecutor(2)
        self.hook_jobs: list[concurrent.futures.Future[tuple[str, int]]] = []
        self.failing_keys: list[str] = []
        self.streams: list[concurrent.futures.Future[None]] = []

    def on_submitted(self, n: int) -> None:
        if n % HOOK_EVERY == HOOK_EVERY // 2:
            text = f"Hooks tenant job {n}."
            self.hook_jobs.append(
                self.pool.submit(submit_until_accepted, self.stack, self.hooks_session, text)
            )
        if n % FAILING_EVERY == FAILING_EVERY // 2:
            key = f"failing-{n}-{time.time_ns()}"
            self.failing_keys.append(key)
            text = failing_text(n)
            self.streams.append(self.pool.submit(_stream_to_its_end, self.stack, self.failing_key, key, text))

    def finish(self, books: Any, timeout: float = 120) -> SideResult:
        """Wait for the side tenants' work, then read what became of it."""
        self.pool.shutdown(wait=True)
        result = SideResult()
        job_ids = [f.result()[0] for f in self.hook_jobs]
        result.hook_jobs = len(job_ids)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self._arrivals()) < len(job_ids):
            time.sleep(1)
        arrivals = self._arrivals()
        rows = books.query(
            "SELECT id::text, extract(epoch FROM finished_at) FROM speech_synthesisjob WHERE id::text = ANY(%s)",
            job_ids,
        )
        for job_id, finished in rows:
            if job_id in arrivals and finished is not None:
                result.hook_events += 1
                result.hook_latencies.append(arrivals[job_id] - float(finished))
        hole = books.query(
            "SELECT coalesce(sum(m.attempts), 0), count(*) FILTER (WHERE m.status = 'delivered') "
            "FROM webhooks_webhookmessage m JOIN tenants_organization o ON o.id = m.organization_id "
            "WHERE o.slug = 'demo'"
        )
        result.black_hole_attempts, result.black_hole_delivered = int(hole[0][0]), int(hole[0][1])
        self._check_failing(books, result)
        self._exit.close()
        return result

    def _arrivals(self) -> dict[str, float]:
        """When each job's job.succeeded event first arrived, by job id."""
        with self.receiver.lock:
            return {str(r.payload["data"]["id"]): r.at for r in self.receiver.unique if r.path == "hooks"}

    def _check_failing(self, books: Any, result: SideResult) -> None:
        jobs = dict(
            books.query(
                "SELECT key, job_id::text FROM speech_idempotencykey WHERE key = ANY(%s)", self.failing_keys
            )
        )
        job_ids = [j for j in jobs.values() if j]
        result.failing_jobs = len(job_ids)
        deadline = time.monotonic() + 120
        while books.finished(job_ids) < len(job_ids) and time.monotonic() < deadline:
            time.sleep(1)
        rows = books.query(
            "SELECT j.id::text, j.status, j.delivered_chars, j.text_chars, "
            "coalesce((SELECT sum(e.characters) FROM speech_usageevent e "
            "WHERE e.job_key = j.id AND e.kind = 'charge'), 0) "
            "FROM speech_synthesisjob j WHERE j.id::text = ANY(%s)",
            job_ids,
        )
        for job_id, status, handed, text_chars, charged in rows:
            result.failing[job_id] = (status, int(charged), int(handed or 0), int(text_chars))
