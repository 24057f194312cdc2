"""Issue 12's load scenario, shared by the e2e test and `make bench` (bench_waiting).

One tenant holds N long-polls (``?wait=30`` on queued jobs) and M waiting
``/v1/audio/speech`` requests at once on gunicorn's ASGI workers, while a
second tenant lists its jobs and a probe calls ``/healthz``. The long-poll
jobs are held back (not dispatched) until every long-poll is counted as
waiting, so all of them really wait together; then they are released to the
real worker and each waiter is answered at its job's claim.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.integration.api.asgi_client import Answer, request

TEXT = "Hi there."
VOICE = "espeak-en-us"


@dataclass
class Timed:
    answer: Answer | None
    sent: float  # time.time(): compared with the database's timestamps on the same host
    received: float
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.received - self.sent

    @property
    def status(self) -> int:
        return self.answer.status if self.answer else 0


@dataclass
class LoadResult:
    long_polls: list[Timed] = field(default_factory=list)
    openai: list[Timed] = field(default_factory=list)
    other_tenant: list[Timed] = field(default_factory=list)
    health: list[Timed] = field(default_factory=list)
    poll_wake_ms: list[float] = field(default_factory=list)  # answer - the job's claim
    openai_wake_ms: list[float] = field(default_factory=list)  # answer - the job's finish
    db_connections_while_waiting: int = 0
    web_threads_while_waiting: int = 0  # all gunicorn worker threads, idle ones included
    wall_seconds: float = 0.0

    def every_answer(self) -> list[Timed]:
        return [*self.long_polls, *self.openai, *self.other_tenant, *self.health]


def make_tenant(name: str, **plan_limits: Any) -> tuple[Any, str]:
    """A tenant on a plan of its own with one key: (organization, raw key)."""
    import uuid

    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    tag = uuid.uuid4().hex[:8]
    plan = Plan.objects.create(slug=f"{name}-{tag}", name=f"{name} {tag}", **plan_limits)
    org = create_organization(f"{name} {tag}", plan=plan)
    _, raw = create_api_key(org, name, created_by=OPERATOR)
    return org, raw


# A plan that admits the whole scenario: waits, jobs, rate and characters.
ROOMY = {
    "max_concurrent_waits": 300,
    "max_concurrent_jobs": 400,
    "requests_per_minute": 10_000,
    "monthly_characters": 10**7,
}


def timed(call: Callable[[], Answer]) -> Timed:
    sent = time.time()
    try:
        return Timed(call(), sent, time.time())
    except Exception as exc:
        return Timed(None, sent, time.time(), repr(exc))


def summary_ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered):.0f} ms, p99 {p99:.0f} ms, max {ordered[-1]:.0f} ms"


@contextlib.contextmanager
def held_back() -> Iterator[Callable[[Any], bool]]:
    """Jobs submitted inside are not dispatched (injected fault); yields the real dispatch."""
    from webapp.speech.services import dispatch

    real = dispatch.dispatch_job
    dispatch.dispatch_job = lambda job_id, *known: False  # type: ignore[assignment]
    try:
        yield real
    finally:
        dispatch.dispatch_job = real  # type: ignore[assignment]


def _submit_held(org: Any, n: int) -> list[Any]:
    from tests.integration.api.direct_jobs import submit_espeak

    return [submit_espeak(org, TEXT).id for _ in range(n)]


def _db_connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _web_threads() -> int:
    import psutil

    from tests.stack import CFG

    socket_path = str(CFG.gunicorn_socket)
    masters = [
        p for p in psutil.process_iter(["cmdline"]) if socket_path in " ".join(p.info["cmdline"] or [])
    ]
    return sum(child.num_threads() for master in masters for child in master.children())


def _start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _probe(other_key: str, stop: Any, out: Any) -> None:
    """The other tenant and /healthz, every 50 ms until ``stop``; in a process of its own, so the
    waiters' client threads (GIL) do not add to what it measures."""
    other: list[Timed] = []
    health: list[Timed] = []
    while not stop.is_set():
        other.append(timed(lambda: request(None, "GET", "/api/v1/speech?limit=20", other_key)))
        health.append(timed(lambda: request(None, "GET", "/healthz")))
        time.sleep(0.05)
    out.put((other, health))


def _until(predicate: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what()}")
        time.sleep(0.05)


def run_scenario(
    web: Any,
    org: Any,
    raw_key: str,
    other_key: str,
    *,
    long_polls: int = 200,
    openai: int = 64,
    poll_jobs: int = 25,
) -> LoadResult:
    """Run the scenario once; the tenant's plan must admit every wait and job."""
    from webapp.speech.services import waits

    result = LoadResult()
    started = time.monotonic()
    with held_back() as dispatch_for_real:
        job_ids = _submit_held(org, poll_jobs)
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    probed = spawn.Queue()
    probe = spawn.Process(target=_probe, args=(other_key, stop, probed), daemon=True)
    probe.start()

    def poll(job_id: Any) -> None:
        result.long_polls.append(
            timed(lambda: request(web, "GET", f"/api/v1/speech/{job_id}?wait=30", raw_key))
        )

    def speak() -> None:
        body = {"model": "tts-1", "input": TEXT, "voice": VOICE, "response_format": "wav"}
        result.openai.append(timed(lambda: request(web, "POST", "/v1/audio/speech", raw_key, body)))

    waiters = [_start(functools.partial(poll, job_ids[i % poll_jobs])) for i in range(long_polls)]
    _until(
        lambda: waits.in_use(org.pk) >= long_polls,
        60,
        lambda: (
            f"{long_polls} long-polls to wait: {waits.in_use(org.pk)} waiting, answered early: "
            f"{[(t.status, t.error or (t.answer.body[:120] if t.answer else b'')) for t in result.long_polls][:5]}"
        ),
    )
    result.db_connections_while_waiting = _db_connections()
    result.web_threads_while_waiting = _web_threads()
    waiters += [_start(speak) for _ in range(openai)]
    for job_id in job_ids:
        dispatch_for_real(job_id)
    for thread in waiters:
        thread.join(150)
    stop.set()
    result.other_tenant, result.health = probed.get(timeout=30)
    probe.join(10)
    result.wall_seconds = time.monotonic() - started
    _wake_delays(org, result)
    return result


def _wake_delays(org: Any, result: LoadResult) -> None:
    """How long after the change that ended its wait each waiter got its answer."""
    from webapp.speech.models import SynthesisJob

    claimed = dict(SynthesisJob.objects.filter(organization=org).values_list("id", "started_at"))
    for t in result.long_polls:
        if t.answer and t.status == 200:
            start = claimed.get(_uuid(t.answer.json()["id"]))
            if start is not None:
                result.poll_wake_ms.append((t.received - start.timestamp()) * 1000)
    openai_jobs = SynthesisJob.objects.filter(organization=org, source="openai")
    finished = sorted(j.finished_at.timestamp() for j in openai_jobs if j.finished_at)
    answered = sorted(t.received for t in result.openai if t.status == 200)
    # Answers and finishes matched in order: the n-th job to finish answered the n-th request.
    result.openai_wake_ms = [(a - f) * 1000 for a, f in zip(answered, finished, strict=False)]


def _uuid(value: str) -> Any:
    import uuid

    return uuid.UUID(value)
