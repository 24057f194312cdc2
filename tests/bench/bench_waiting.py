"""Waiting benchmark (issue 12): 200 long-polls + 64 waiting /v1/audio/speech requests of one key.

Starts the test stack's web tier (gunicorn with uvicorn workers) and a real
eSpeak worker, runs tests/e2e/waiting_load.py's scenario and reports:

- ``/healthz`` p99 and the other tenant's ``GET /api/v1/speech`` p99 while
  the waits are held (goals: under 100 ms and 200 ms);
- how long after the change that ended its wait each waiter was answered:
  a long-poll from its job's claim, an OpenAI request from its job's finish
  (goal: under 50 ms);
- PostgreSQL connections open while the 200 long-polls wait.

``quick=True`` runs 50 long-polls and 16 OpenAI requests.
"""

from __future__ import annotations

from typing import Any

from tests.bench.bench_worker import _setup, _voices


def _ms(samples: list[Any]) -> list[float]:
    return [t.seconds * 1000 for t in samples]


def _report(result: Any, long_polls: int, openai: int) -> list[str]:
    from tests.e2e.waiting_load import summary_ms

    answered = [t for t in result.every_answer() if t.status]
    server_errors = sum(1 for t in answered if t.status >= 500)
    failed = sum(1 for t in result.every_answer() if t.error)
    return [
        f"{long_polls} long-polls + {openai} OpenAI waits of one key, {result.wall_seconds:.1f} s wall",
        f"  answered: long-polls {sum(t.status == 200 for t in result.long_polls)}/{long_polls}, "
        f"OpenAI {sum(t.status == 200 for t in result.openai)}/{openai}; "
        f">= 500: {server_errors}; transport errors: {failed}",
        f"  /healthz ({len(result.health)} calls): {summary_ms(_ms(result.health))}",
        f"  other tenant GET /api/v1/speech ({len(result.other_tenant)} calls): "
        f"{summary_ms(_ms(result.other_tenant))}",
        f"  long-poll answered after its job's claim: {summary_ms(result.poll_wake_ms)}",
        f"  OpenAI answered after its job finished: {summary_ms(result.openai_wake_ms)}",
        f"  while the long-polls wait: {result.db_connections_while_waiting} PostgreSQL connections, "
        f"{result.web_threads_while_waiting} threads in the gunicorn workers",
    ]


def run(quick: bool) -> list[str]:
    stack, owned = _setup()  # Django on the test stack's settings first: then the scenario's imports
    try:
        result, long_polls, openai = _scenario(stack, quick)
    finally:
        if owned:
            stack.stop_all()
    lines = _report(result, long_polls, openai)
    print("\n".join(lines), flush=True)
    return lines


def _scenario(stack: Any, quick: bool) -> tuple[Any, int, int]:
    from django.core.management import call_command

    from tests.e2e.waiting_load import ROOMY, make_tenant, run_scenario

    _voices()
    long_polls, openai = (50, 16) if quick else (200, 64)
    call_command("collectstatic", "--noinput", verbosity=0)
    web = stack.start_web(env={"DJANGO_DEBUG": "0"})  # production settings (the suite runs with DEBUG)
    worker = stack.start_worker("bench-waiting", concurrency="2")
    try:
        busy, busy_key = make_tenant("bench-busy", **ROOMY)
        _, other_key = make_tenant("bench-other", requests_per_minute=10_000)
        return (
            run_scenario(stack, busy, busy_key, other_key, long_polls=long_polls, openai=openai),
            long_polls,
            openai,
        )
    finally:
        stack.stop_service(worker)
        for service in reversed(web):
            stack.stop_service(service)
