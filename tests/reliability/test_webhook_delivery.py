"""Webhooks sent by a real ``webhooks`` worker to a receiver on 127.0.0.1, through faults.

Every event is made through the code that makes it (tests/webhook_events.py);
the receiver verifies each request with ``standardwebhooks`` and drops the
duplicates by ``webhook-id``. Each event must arrive once per endpoint after
that, while the receiver answers 500 twice first and Redis restarts during the
retries, and while the worker sending is killed mid-request. The test process
runs the outbox sweep every second, as beat does every TTS_WEBHOOK_SWEEP_SECONDS.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests import webhook_events
from tests.reliability.helpers import flush_queues, kill_group, make_org, wait_until
from tests.stack import CFG, TestStack, running
from tests.webhook_receiver import Receiver, receiving

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_ENV = {
    "TTS_WORKER_ROLE": "webhooks",
    "TTS_WEBHOOK_ALLOW_PRIVATE": "127.0.0.0/8",
    "TTS_WEBHOOK_RETRY_BASE_SECONDS": "2",  # first retry after 1-2 s: Redis restarts before the second
    "TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS": "1",
    "TTS_WEBHOOK_READ_TIMEOUT_SECONDS": "2",  # the message's lease: 1 + 2 x 2 + 5 = 10 s
}


@pytest.fixture(autouse=True)
def _fast_sweep(settings: Any, stack: TestStack) -> None:
    import ipaddress

    settings.TTS_WEBHOOK_ALLOW_PRIVATE = [ipaddress.ip_network("127.0.0.0/8")]
    flush_queues(stack, "webhooks")  # messages of in-process tests, whose rows are gone


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


def _worker(stack: TestStack, name: str) -> Service:
    return stack.start_worker(name, queues="webhooks", concurrency="2", env=WORKER_ENV, wait_ready=False)


def _endpoint(org: Any, receiver: Receiver, name: str) -> None:
    from webapp.webhooks import delivery
    from webapp.webhooks.models import SUBSCRIBABLE, WebhookEndpoint

    secret = delivery.new_secret()
    WebhookEndpoint.objects.create(
        organization=org, url=receiver.url(name), events=SUBSCRIBABLE, secret=secret
    )
    receiver.secrets[name] = secret


def _sweep_until(done: Any, timeout: float, what: str) -> None:
    """What beat would do: the sweep, every second, until ``done()``."""
    from webapp.webhooks import delivery

    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        delivery.sweep()
        time.sleep(1)


def _redis_restarted(stack: TestStack) -> None:
    redis = next(s for s in stack.sup.services if s.name == "redis")
    stack.stop_service(redis)  # SIGTERM: it writes its AOF out, as on a normal restart
    time.sleep(1)
    stack.start_service(Service("redis", deploy_stack.redis_command(CFG), ready_port=CFG.redis_port))


def test_every_event_arrives_once_per_endpoint_through_500s_and_a_redis_restart(
    stack: TestStack, builtin_voices: list[str], receiver: Receiver
) -> None:
    org = make_org("webhooks-redis", monthly_characters=100)
    _endpoint(org, receiver, "a")
    _endpoint(org, receiver, "b")
    receiver.fail_first = 2
    with running(stack, _worker(stack, "webhooks-1")):
        made = webhook_events.every_event(org)
        assert len(made) == 9
        wait_until(lambda: len(receiver.seen) == 2 * len(made), 60, "a first attempt at every message")
        assert len(receiver.unique) < 2 * len(made)  # retries are still to come
        _redis_restarted(stack)  # the retries' messages were in Redis and in the worker's hands
        _sweep_until(lambda: len(receiver.unique) == 2 * len(made), 60, "every message delivered")
    assert set(receiver.events("a")) == set(receiver.events("b")) == made
    assert min(receiver.seen.values()) >= 3 and not receiver.rejected
    assert all(r.headers["webhook-id"].startswith("msg_") for r in receiver.unique)


def test_every_event_arrives_once_when_the_worker_sending_it_is_killed(
    stack: TestStack, builtin_voices: list[str], receiver: Receiver
) -> None:
    from webapp.webhooks.models import WebhookMessage

    org = make_org("webhooks-kill", monthly_characters=100)
    _endpoint(org, receiver, "k")
    receiver.hold_first, receiver.hold_seconds = 2, 3.0
    first = _worker(stack, "webhooks-doomed")
    with running(stack, first):
        made = webhook_events.every_event(org)
        wait_until(lambda: len(receiver.requests) >= 2, 60, "two requests in flight")
        kill_group(first)  # the node dies: its two messages stay unacknowledged in Redis
    with running(stack, _worker(stack, "webhooks-2")):
        _sweep_until(
            lambda: not WebhookMessage.objects.filter(organization=org).exclude(status="delivered").exists(),
            60,
            "every message delivered after the kill",
        )
    assert set(receiver.events("k")) == made and len(receiver.unique) == len(made)
    # The two cut off were received (the receiver answered a dead socket) and sent again: duplicates, dropped.
    assert sorted(receiver.seen.values())[-2:] == [2, 2] and not receiver.rejected


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A receiver that takes connections and never answers (nothing accepts them): its URL."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(256)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hole"


def _flood_black_hole(black_hole: str, name: str) -> tuple[Any, Any]:
    """A greedy tenant with 45 messages to three endpoints that never answer, another tenant with a
    receiver that answers; both organisations."""
    from django.db import transaction

    from webapp.webhooks import delivery, outbox
    from webapp.webhooks.models import EventType, WebhookEndpoint

    greedy, other = make_org(f"{name}-greedy"), make_org(f"{name}-other")
    for _ in range(3):
        WebhookEndpoint.objects.create(
            organization=greedy, url=black_hole, events=[], secret=delivery.new_secret()
        )
    with transaction.atomic():
        for n in range(15):
            outbox.record(greedy.id, EventType.PING, {"n": n}, subject=f"flood-{n}")
    return greedy, other


def _greedy_in_flight(greedy: Any) -> Any:
    from webapp.webhooks.models import WebhookMessage

    return WebhookMessage.objects.filter(organization=greedy, status="pending", lease_until__isnull=False)


def _other_latencies(
    other: Any, receiver: Receiver, greedy: Any, count: int = 3
) -> tuple[list[float], list[int]]:
    """Seconds from each of the other tenant's events to its arrival, and the greedy tenant's attempts in
    flight when it arrived. Each event is recorded while the greedy tenant holds two children: one of its
    attempts may end (its 2 s read timeout) before the next is leased, so the count is taken at both ends."""
    from django.db import transaction

    from webapp.webhooks import outbox
    from webapp.webhooks.models import EventType

    held = _greedy_in_flight(greedy)
    latencies, shares = [], []
    for n in range(count):
        time.sleep(0.5)
        wait_until(
            lambda: held.filter(lease_until__gte=timezone.now()).count() >= 2, 30, "two greedy attempts"
        )
        started = time.monotonic()
        with transaction.atomic():
            outbox.record(other.id, EventType.PING, {"n": n}, subject=f"other-{n}")
        wait_until(lambda n=n: len(receiver.unique) > n, 30, f"the other tenant's event {n}")
        latencies.append(time.monotonic() - started)
        shares.append(_greedy_in_flight(greedy).filter(lease_until__gte=timezone.now()).count())
    return latencies, shares


def test_a_receiver_that_never_answers_delays_no_other_tenants_events(
    stack: TestStack, builtin_voices: list[str], receiver: Receiver, black_hole: str
) -> None:
    """The greedy tenant's 45 messages to three endpoints that never answer would hold all four children
    of the worker for 20 s; its share is two, and another tenant's events go at once beside them."""
    from webapp.webhooks.models import WebhookMessage

    worker = stack.start_worker(
        "webhooks-shared", queues="webhooks", concurrency="4", env=WORKER_ENV, wait_ready=False
    )
    with running(stack, worker):
        greedy, other = _flood_black_hole(black_hole, "webhooks")
        _endpoint(other, receiver, "other")
        wait_until(
            lambda: _greedy_in_flight(greedy).count() >= 2, 60, "the greedy tenant's attempts in flight"
        )
        latencies, shares = _other_latencies(other, receiver, greedy)
        assert max(latencies) < 1.5, latencies
        # Its events went while the greedy tenant held its whole share (each was recorded with two of the
        # greedy tenant's attempts in flight), and the greedy tenant never took more.
        assert len(shares) == 3 and max(shares) <= 2, shares
        assert WebhookMessage.objects.filter(organization=greedy, attempts__gt=0).count() < 45
        assert WebhookMessage.objects.filter(organization=greedy, status="delivered").count() == 0


def test_after_a_redis_crash_a_receiver_that_never_answers_still_delays_no_other_tenant(
    stack: TestStack, builtin_voices: list[str], receiver: Receiver, black_hole: str
) -> None:
    """Redis is killed while two of the worker's four children wait ten seconds on the greedy tenant's
    receiver. Celery flushes the pool as the connection drops and forgot that those two were busy: the
    other tenant's events were written to them and waited for their attempts (6.4 and 8.0 s). Once the
    worker is back on Redis they go to the idle children at once (webapp/celery_pool.py)."""
    from webapp.webhooks.models import WebhookMessage

    env = {**WORKER_ENV, "TTS_WEBHOOK_READ_TIMEOUT_SECONDS": "10"}
    worker = stack.start_worker(
        "webhooks-crash", queues="webhooks", concurrency="4", env=env, wait_ready=False
    )
    with running(stack, worker):
        greedy, other = _flood_black_hole(black_hole, "webhooks-crash")
        _endpoint(other, receiver, "other")
        in_flight = _greedy_in_flight(greedy)
        retrying = WebhookMessage.objects.filter(organization=greedy, attempts=1, lease_until__isnull=True)
        wait_until(
            lambda: retrying.exists() and in_flight.count() >= 2, 60, "retries waiting, attempts in flight"
        )
        log = CFG.log_dir / f"{worker.name}.log"
        logged = log.stat().st_size
        redis = next(s for s in stack.sup.services if s.name == "redis")
        assert redis.process is not None
        redis.process.kill()  # SIGKILL: as a node loses it
        redis.process.wait(10)
        stack.stop_service(redis)
        stack.start_service(Service("redis", deploy_stack.redis_command(CFG), ready_port=CFG.redis_port))
        wait_until(lambda: b"Connected to redis" in log.read_bytes()[logged:], 30, "the worker back on Redis")
        time.sleep(1)
        assert in_flight.filter(lease_until__gte=timezone.now()).count() == 2  # still waiting on the hole
        latencies, _ = _other_latencies(other, receiver, greedy)
        assert max(latencies) < 1.5, latencies
