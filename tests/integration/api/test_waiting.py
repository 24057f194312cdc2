"""Waiting for a job: woken by its notification within ~20 ms, no reads while nothing changes,
once a second with Redis away, and the per-tenant cap on concurrent waits."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.integration.api.conftest import Tenant, problem
from tests.integration.api.direct_jobs import submit_espeak


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected fault: no message reaches a worker, so the jobs stay queued until the test moves them."""
    from webapp.speech.services import dispatch

    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """When the waiters read the job row (the real read, counted)."""
    from webapp.speech.services import waiting

    seen: list[float] = []
    real = waiting._read_row

    def counted(job_id: Any) -> Any:
        seen.append(time.monotonic())
        return real(job_id)

    monkeypatch.setattr(waiting, "_read_row", counted)
    yield seen


@pytest.fixture
def tenant(live_tenant: Any, no_dispatch: None) -> Tenant:
    t: Tenant = live_tenant(max_concurrent_waits=2)
    return t


def _wait(job_id: Any, seconds: float, woke: dict[Any, float], in_transaction: bool) -> Any:
    from webapp.speech.services.waiting import await_job

    async def one() -> None:
        await await_job(job_id, seconds, lambda state: state[0] != "queued", in_transaction)
        woke[job_id] = time.monotonic()

    return one()


def _wait_all(job_ids: list[Any], seconds: float) -> dict[Any, float]:
    woke: dict[Any, float] = {}
    in_transaction = connection.in_atomic_block  # as a view would see it, before the wait

    async def all_of_them() -> None:
        await asyncio.gather(*(_wait(j, seconds, woke, in_transaction) for j in job_ids))

    try:
        asyncio.run(all_of_them())
    finally:
        connection.close()
    return woke


def _claim_later(job_ids: list[Any], delay: float, changed: dict[Any, float]) -> threading.Thread:
    from webapp.speech import lifecycle

    def run() -> None:
        try:
            time.sleep(delay)
            for job_id in job_ids:
                assert lifecycle.claim_job(job_id, "test-worker:1") is not None
                changed[job_id] = time.monotonic()  # committed and published
                time.sleep(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_each_waiter_wakes_within_20_ms_of_its_jobs_change(tenant: Tenant, reads: list[float]) -> None:
    job_ids = [submit_espeak(tenant.org).id for _ in range(10)]
    changed: dict[Any, float] = {}
    thread = _claim_later(job_ids, 1.0, changed)
    woke = _wait_all(job_ids, 10)
    thread.join()
    delays = sorted(woke[j] - changed[j] for j in job_ids)
    assert statistics.median(delays) < 0.02, delays
    assert delays[-1] < 0.05, delays
    # One read after subscribing, nothing while the jobs sat queued, and none on waking: the
    # claim's notification says the job is running.
    assert len(reads) == len(job_ids)


def test_a_notification_without_a_state_makes_the_waiter_read_the_row(
    tenant: Tenant, reads: list[float]
) -> None:
    from webapp import redis_clients
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services.notify import channel

    job = submit_espeak(tenant.org)
    changed: dict[Any, float] = {}

    def claim_quietly_then_say_changed() -> None:
        try:
            time.sleep(1.0)
            # The row moves without its own message (as a publisher that says only "changed" would)...
            SynthesisJob.objects.filter(pk=job.id).update(status="running")
            changed[job.id] = time.monotonic()
            redis_clients.notifications().publish(channel(job.id), "changed")
        finally:
            connection.close()

    thread = threading.Thread(target=claim_quietly_then_say_changed)
    thread.start()
    woke = _wait_all([job.id], 10)
    thread.join()
    # ...so the waiter reads the row to learn what changed, and wakes at once.
    assert len(reads) == 2
    assert woke[job.id] - changed[job.id] < 0.5


def test_a_notification_says_the_jobs_state_exactly() -> None:
    from webapp.speech.services.notify import parse_state

    progress = 2 / 3  # no digits lost on the way: the long-poll compares it with what it saw
    assert parse_state(f"running {progress!r}".encode()) == ("running", progress)
    assert parse_state("succeeded 1.0") == ("succeeded", 1.0)
    assert parse_state(b"changed") is None
    assert parse_state(b"running soon") is None


def test_a_waiter_reads_nothing_while_its_job_does_not_change(tenant: Tenant, reads: list[float]) -> None:
    job = submit_espeak(tenant.org)
    started = time.monotonic()
    woke = _wait_all([job.id], 2.0)
    assert woke[job.id] - started >= 2.0
    assert len(reads) == 1


def test_with_redis_away_a_waiter_reads_once_a_second(
    tenant: Tenant, reads: list[float], settings: Any
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens on the discard port
    job = submit_espeak(tenant.org)
    changed: dict[Any, float] = {}
    thread = _claim_later([job.id], 2.5, changed)
    woke = _wait_all([job.id], 10)
    thread.join()
    gaps = [b - a for a, b in zip(reads, reads[1:], strict=False)]
    assert all(gap >= 0.95 for gap in gaps), gaps  # never more than once a second
    assert 3 <= len(reads) <= 5, reads
    assert 0 <= woke[job.id] - changed[job.id] <= 1.1


# --------------------------------------------------------------------- the cap, through gunicorn (ASGI)


def _long_poll(web: Any, raw_key: str, job_id: Any, seconds: int, out: list[Any]) -> threading.Thread:
    from tests.integration.api.asgi_client import request

    def run() -> None:
        out.append(request(web, "GET", f"/api/v1/speech/{job_id}?wait={seconds}", raw_key))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _until(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_one_wait_over_the_plans_cap_gets_429_and_slots_come_back(web: Any, tenant: Tenant) -> None:
    from tests.integration.api.asgi_client import request
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import waits

    job = submit_espeak(tenant.org)
    answers: list[Any] = []
    threads = [_long_poll(web, tenant.raw_key, job.id, 3, answers) for _ in range(2)]
    _until(lambda: waits.in_use(tenant.org.pk) == 2)
    refused = request(web, "GET", f"/api/v1/speech/{job.id}?wait=3", tenant.raw_key)
    assert refused.status == 429
    assert refused["Retry-After"] == "1"
    assert problem(refused)["code"] == "too_many_waits"
    before = SynthesisJob.objects.filter(organization=tenant.org).count()
    openai = request(
        web, "POST", "/v1/audio/speech", tenant.raw_key, {"model": "tts-1", "input": "Hi.", "voice": "alloy"}
    )
    assert openai.status == 429 and openai.json()["error"]["code"] == "too_many_waits"
    assert SynthesisJob.objects.filter(organization=tenant.org).count() == before  # nothing submitted
    assert request(web, "GET", f"/api/v1/speech/{job.id}", tenant.raw_key).status == 200  # no wait: no slot
    for th in threads:
        th.join(15)
    assert [a.status for a in answers] == [200, 200]
    assert waits.in_use(tenant.org.pk) == 0
    assert request(web, "GET", f"/api/v1/speech/{job.id}?wait=1", tenant.raw_key).status == 200


def test_a_slot_of_a_killed_process_ages_out(tenant: Tenant) -> None:
    from webapp import redis_clients
    from webapp.speech.services import waits

    waits.acquire(tenant.org, 1)
    waits.acquire(tenant.org, 1)  # never released, as if the process died
    key = waits.key(tenant.org.pk)
    redis = redis_clients.notifications()
    # Move both members' expiry into the past instead of waiting 31 s for it.
    redis.zadd(key, {member: 0 for member in redis.zrange(key, 0, -1)})  # type: ignore[type-var]
    assert waits.acquire(tenant.org, 1) is not None
    assert 0 < redis.pttl(key) <= 31_000


def _long_polls_in_process(raw_key: str, job_id: Any, count: int, then: Any) -> list[Any]:
    """``count`` long-polls on one job through the ASGI view in this process, ``then()`` once all wait."""
    from asgiref.sync import ThreadSensitiveContext
    from django.test import AsyncClient

    from webapp.speech.services import waits

    client = AsyncClient()
    auth = {"Authorization": f"Bearer {raw_key}"}

    async def poll() -> Any:
        # Each request's sync parts in a thread of its own, as the ASGI handler does (the test client does not).
        async with ThreadSensitiveContext():
            return await client.get(f"/api/v1/speech/{job_id}?wait=10", headers=auth)

    async def run() -> list[Any]:
        polls = [asyncio.ensure_future(poll()) for _ in range(count)]
        org_id = await asyncio.to_thread(_org_of, job_id)
        for _ in range(200):
            if await asyncio.to_thread(waits.in_use, org_id) >= count:
                break
            await asyncio.sleep(0.02)
        await asyncio.to_thread(then)
        return list(await asyncio.gather(*polls))

    try:
        return asyncio.run(run())
    finally:
        connection.close()


def _org_of(job_id: Any) -> Any:
    from webapp.speech.models import SynthesisJob

    try:
        return SynthesisJob.objects.filter(pk=job_id).values_list("organization_id", flat=True).get()
    finally:
        connection.close()


def test_waiters_woken_by_one_change_share_one_answer(
    live_tenant: Any, no_dispatch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.api import views

    tenant = live_tenant(max_concurrent_waits=10)
    job = submit_espeak(tenant.org)
    builds: list[Any] = []
    real = views.job_after_wait.build

    def slow_build(request: Any, job_id: Any) -> Any:
        builds.append(job_id)
        time.sleep(0.2)  # every waiter woken by the change arrives while the first one builds
        return real(request, job_id)

    monkeypatch.setattr(views.job_after_wait, "build", slow_build)
    answers = _long_polls_in_process(tenant.raw_key, job.id, 6, lambda: lifecycle.claim_job(job.id, "t:1"))
    assert [a.status_code for a in answers] == [200] * 6, answers[0].content
    bodies = [a.json() for a in answers]
    assert all(b["status"] == "running" and b["id"] == str(job.id) for b in bodies)
    assert all(b == bodies[0] for b in bodies)
    assert len({a.headers["RateLimit"] for a in answers}) == 6  # each its own count, not the builder's
    assert builds == [job.id]  # the row read and serialised once for the six


def test_a_shared_build_is_not_kept_after_it_ends() -> None:
    from webapp.speech.services.waiting import shared

    built: list[int] = []

    async def build() -> int:
        built.append(1)
        await asyncio.sleep(0.05)
        return len(built)

    async def run() -> list[int]:
        together = await asyncio.gather(*(shared("k", build) for _ in range(3)))
        later = await shared("k", build)
        return [*together, later]

    assert asyncio.run(run()) == [1, 1, 1, 2]


@pytest.mark.parametrize("how", ["raises", "is_canceled"])
def test_when_the_shared_build_fails_each_sharer_builds_its_own(how: str) -> None:
    from webapp.speech.services.waiting import shared

    calls: list[str] = []

    async def first_build() -> str:
        calls.append("first")
        await asyncio.sleep(0.05)
        if how == "raises":
            raise RuntimeError("database went away")
        await asyncio.sleep(10)
        return "never"

    async def own_build() -> str:
        calls.append("own")
        return "own answer"

    async def run() -> list[Any]:
        builder = asyncio.ensure_future(shared("k", first_build))
        await asyncio.sleep(0.01)
        sharers = [asyncio.ensure_future(shared("k", own_build)) for _ in range(2)]
        await asyncio.sleep(0.1)
        if how == "is_canceled":  # its client went away
            builder.cancel()
        outcomes = await asyncio.gather(builder, *sharers, return_exceptions=True)
        return [type(o).__name__ if isinstance(o, BaseException) else o for o in outcomes]

    expected_error = "RuntimeError" if how == "raises" else "CancelledError"
    assert asyncio.run(run()) == [expected_error, "own answer", "own answer"]
    assert calls == ["first", "own", "own"]


def test_waiters_on_a_job_deleted_meanwhile_get_a_404_naming_it(live_tenant: Any, no_dispatch: None) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant(max_concurrent_waits=10)
    job = submit_espeak(tenant.org)
    answers = _long_polls_in_process(
        tenant.raw_key, job.id, 2, lambda: lifecycle.delete_job(SynthesisJob.objects.get(pk=job.id))
    )
    assert [a.status_code for a in answers] == [404, 404]
    assert all(problem(a)["code"] == "not_found" for a in answers)
    assert all(str(job.id) in problem(a)["detail"] for a in answers)


# --------------------------------------------------------------------- one shared Redis connection


def _pubsub_clients() -> list[dict[str, Any]]:
    from webapp import redis_clients

    clients: list[dict[str, Any]] = redis_clients.notifications().client_list(_type="pubsub")
    return clients


def _subscribers(channel_name: str) -> int:
    from webapp import redis_clients

    return int(dict(redis_clients.notifications().pubsub_numsub(channel_name))[channel_name])


def test_the_waiters_of_a_process_share_one_redis_connection(tenant: Tenant) -> None:
    from webapp.speech.services.notify import channel

    job_ids = [submit_espeak(tenant.org).id for _ in range(10)]
    before = {c["id"] for c in _pubsub_clients()}
    seen: dict[str, Any] = {}
    in_transaction = connection.in_atomic_block

    async def scenario() -> dict[Any, float]:
        woke: dict[Any, float] = {}
        # Two waiters per job, as a web process holds long-polls of several clients on one job.
        waiters = [asyncio.create_task(_wait(j, 10, woke, in_transaction)) for j in job_ids * 2]
        while _subscribers(channel(job_ids[-1])) < 1:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # every waiter subscribed (or failed to)
        seen["clients"] = [c for c in await asyncio.to_thread(_pubsub_clients) if c["id"] not in before]
        seen["per_channel"] = [await asyncio.to_thread(_subscribers, channel(j)) for j in job_ids]
        changed: dict[Any, float] = {}
        claimer = _claim_later(job_ids, 0.0, changed)
        await asyncio.gather(*waiters)
        await asyncio.to_thread(claimer.join)
        seen["after"] = [await asyncio.to_thread(_subscribers, channel(j)) for j in job_ids]
        return {j: woke[j] - changed[j] for j in job_ids}

    try:
        delays = asyncio.run(scenario())
    finally:
        connection.close()
    # Twenty waiters: one connection (each used to open its own), one subscription per job.
    assert len(seen["clients"]) == 1, seen["clients"]
    assert seen["per_channel"] == [1] * len(job_ids)
    assert max(delays.values()) < 0.5, delays  # woken by the notification, not the 1 s fallback
    assert seen["after"] == [0] * len(job_ids)  # the last waiter of a job unsubscribed


def test_a_channel_left_and_joined_again_at_once_still_delivers(stack: Any) -> None:
    from webapp import redis_clients
    from webapp.speech.services import notifications

    async def scenario() -> list[bytes | None]:
        got = []
        for round_ in range(20):
            name = f"tts:test:rejoin:{round_}"
            first = await notifications.subscribe(name)
            # The UNSUBSCRIBE of the last listener and the SUBSCRIBE of the next one race.
            _, second = await asyncio.gather(first.close(), notifications.subscribe(name))
            await asyncio.to_thread(redis_clients.notifications().publish, name, "running 0.5")
            got.append(await second.get(timeout=2))
            await second.close()
        return got

    assert asyncio.run(scenario()) == [b"running 0.5"] * 20


def test_when_the_shared_connection_drops_waiters_read_their_rows_and_the_next_reconnects(
    tenant: Tenant, reads: list[float]
) -> None:
    from webapp import redis_clients
    from webapp.speech.services import notifications
    from webapp.speech.services.notify import channel

    job_ids = [submit_espeak(tenant.org).id for _ in range(3)]
    seen: dict[str, Any] = {}
    in_transaction = connection.in_atomic_block

    async def scenario() -> dict[Any, float]:
        woke: dict[Any, float] = {}
        waiters = [asyncio.create_task(_wait(j, 10, woke, in_transaction)) for j in job_ids]
        while _subscribers(channel(job_ids[-1])) < 1:
            await asyncio.sleep(0.02)
        # Injected fault: the shared connection is killed while every waiter is subscribed on it.
        conn = notifications.hub()._conn
        port = conn._writer.get_extra_info("sockname")[1]
        mine = [c for c in _pubsub_clients() if c["addr"].endswith(f":{port}")]
        seen["subscribed_when_killed"] = [_subscribers(channel(j)) for j in job_ids]
        redis_clients.notifications().client_kill_filter(_id=mine[0]["id"])
        await asyncio.sleep(0.3)
        seen["reads_after_kill"] = len(reads)
        changed: dict[Any, float] = {}
        claimer = _claim_later(job_ids, 0.5, changed)
        await asyncio.gather(*waiters)
        await asyncio.to_thread(claimer.join)
        # A later waiter opens a new connection, and notifications flow again.
        again = await notifications.subscribe("tts:test:after-kill")
        await asyncio.to_thread(redis_clients.notifications().publish, "tts:test:after-kill", "x")
        seen["after"] = await again.get(timeout=2)
        await again.close()
        return {j: woke[j] - changed[j] for j in job_ids}

    try:
        delays = asyncio.run(scenario())
    finally:
        connection.close()
    assert seen["subscribed_when_killed"] == [1, 1, 1]  # the fault hit waiters that were waiting
    # Each waiter read its row once on subscribing and once more when told the connection was lost...
    assert seen["reads_after_kill"] == 2 * len(job_ids)
    # ...then found its change by reading once a second.
    assert all(0 <= d <= 1.2 for d in delays.values()), delays
    assert seen["after"] == b"x"


def test_a_subscription_counts_as_confirmed_only_when_every_subscribe_sent_is_answered() -> None:
    from webapp.speech.services.notifications import Hub

    async def scenario() -> list[bool]:
        # A listener left before Redis confirmed its SUBSCRIBE, and the next one subscribed
        # again: Redis answers subscribe, unsubscribe, subscribe. Only the last answer is the
        # next listener's; taking the first for it would let a change published between the
        # UNSUBSCRIBE and the second SUBSCRIBE go unseen.
        hub = Hub()
        confirmed = asyncio.get_running_loop().create_future()
        hub._confirmed["c"], hub._unanswered["c"] = confirmed, 2
        seen = []
        for reply in ([b"subscribe", b"c", 1], [b"unsubscribe", b"c", 0], [b"subscribe", b"c", 1]):
            hub._handle(reply)
            seen.append(confirmed.done())
        return seen

    assert asyncio.run(scenario()) == [False, False, True]
