"""Waiting for a job to change without holding a thread, a connection, or polling PostgreSQL.

A waiting endpoint is one async view (``wait_view``), read top to bottom: its
sync part (``prepare``: authentication, permissions, rate, validation, the
job lookup, the tenant's wait slot) runs in a thread and returns either the
finished answer or a ``Wait``; the view then waits as a coroutine and builds
the answer after the wait (``SharedAnswer``: once for all waiters of a job
woken by one change). A DRF view prepares through its own ``dispatch``
(``api.waiting.WaitingAPIView``: a handler may return a ``Wait``), so whatever
authentication, permissions and throttles it has run in DRF's ``initial()``
and its errors go through ``handle_exception``. The API and the dashboard both
stand on this module.

A waiter subscribes to the job's channel first (over its process's one shared Redis connection,
``services.notifications``) and then reads the row, so no
change between the two is missed; after that it reads the row only when a
notification arrives (``services.notify``), or at its deadline. If Redis is
away it falls back to reading the row once a second. The long-poll, the
dashboard's job status and the OpenAI endpoint all wait here.

Before it waits, a request gives back the database connection its sync part
used (Django would close it only once the response is sent) and its key's
turn (``gate.release``); the wait slot it took (``services.waits``) is given
back however the request ends, and a streamed answer's when the stream closes.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError

from webapp import gate
from webapp.speech.models import SynthesisJob
from webapp.speech.services import notifications, waits
from webapp.speech.services.notifications import NotificationsLost, Subscription
from webapp.speech.services.notify import channel, parse_state
from webapp.tenants.models import Organization

log = logging.getLogger(__name__)

FALLBACK_POLL_SECONDS = 1.0
# Sync parts of waiting requests running at once per process, each phase on its
# own: the first (auth, validation, submit) and the answer. They bound the pooled
# connections a burst of waiters takes (DATABASE_POOL_SIZE, 20), and answers
# never queue behind submits waiting for their tenant's lock. Fairness between
# clients is the gate's (webapp/gate.py): one key's requests run at most two at
# a time per process, in both phases.
SYNC_SLOTS = 6

JobState = tuple[str, float]

T = TypeVar("T")


class WaitSlot:
    """One of a tenant's wait slots (``services.waits``), taken for one request and given back once."""

    def __init__(self, organization_id: Any, token: str | None) -> None:
        self.organization_id = organization_id
        self.token = token  # None: not counted (Redis away)

    @classmethod
    def take(cls, organization: Organization, seconds: float) -> WaitSlot:
        """A slot for ``seconds``, before anything is done for the request (429 ``too_many_waits``)."""
        return cls(organization.pk, waits.acquire(organization, seconds))

    def give_back(self) -> None:
        token, self.token = self.token, None
        waits.release(self.organization_id, token)

    def given_back_on_close(self, response: HttpResponseBase) -> HttpResponseBase:
        """A streamed answer waits while it streams: its slot goes back when the response closes."""
        # Django's private list of what closing the response calls (webapp/private_apis.py).
        closers = getattr(response, "_resource_closers", None)
        if closers is None:
            self.give_back()
        else:
            closers.append(self.give_back)
        return response


@dataclass(frozen=True)
class Wait:
    """What the sync part of a waiting request hands to its wait: which job, how long, until what."""

    job_id: Any
    seconds: float
    done: Callable[[JobState], bool]
    # Given back once the answer is built (or the request ends otherwise).
    slot: WaitSlot | None = None
    # Headers the answer carries: a DRF view's RateLimit headers (WaitingAPIView).
    headers: Mapping[str, str] = field(default_factory=dict)
    # What the sync part saw, for an answer that needs it (the dashboard's, for a job deleted meanwhile).
    seen: Any = None
    # The answer the wait is for, as its route names it (the OpenAI route's: file or events).
    answer: Any = None
    # The view ran inside a transaction (a test's): the wait reads the row on that connection.
    in_transaction: bool = False
    # The request is the job's waiter (/v1/audio/speech): ``lease.renew`` while it waits, and
    # ``lease.leave`` at once if it goes away before its answer is built (the client disconnected).
    lease: WaiterLease | None = None
    # More jobs the answer waits for, with the same deadline, done test and lease (a batch's).
    others: tuple[Any, ...] = ()

    @property
    def jobs(self) -> tuple[Any, ...]:
        return (self.job_id, *self.others)


@dataclass(frozen=True)
class WaiterLease:
    """What a waiting request that holds its job's waiter lease does (sync, each run in a pool thread)."""

    renew: Callable[[Any], Any]  # job id: the client is still here
    leave: Callable[[Any], Any]  # job id: the client went away (abandon the job)
    every: float  # seconds between renewals
    # The job was made by this request, with a whole lease (lifecycle.submit_job): the first renewal
    # waits a period. Renewing at once locked the row just as a worker went to claim it.
    fresh: bool = False


Prepare = Callable[..., HttpResponseBase | Wait]


@dataclass
class SharedAnswer:
    """An answer after a wait whose costly part the waiters of one job share.

    ``build`` (sync, in a thread, with a database connection) reads and
    serialises the job; ``respond`` (in the event loop, no queries) turns the
    request's ``Wait`` and what was built into its response. Waiters of a job woken by the same
    change in one process run ``build`` once: a burst of long-polls on one job
    used to read and serialise the same row once each, one key's answers two
    at a time, and the last of them waited for all the others.
    """

    build: Callable[[HttpRequest, Any], Any]
    respond: Callable[[HttpRequest, Wait, Any], HttpResponseBase]


# Not shared: a sync answer of its own (in a thread) for each request.
Answer = Callable[[HttpRequest, Wait], HttpResponseBase] | SharedAnswer


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _sync_slots(phase: str) -> asyncio.Semaphore:
    per_loop = _slots.setdefault(asyncio.get_running_loop(), {})
    if phase not in per_loop:
        per_loop[phase] = asyncio.Semaphore(SYNC_SLOTS)
    return per_loop[phase]


_building: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)
_FAILED = object()


async def shared(key: Hashable, build: Callable[[], Awaitable[T]]) -> T:
    """``build()``, or the result of the same build already running in this loop under ``key``.

    Only callers that arrive while a build runs share it: nothing is kept
    after it, so a later caller never gets an old answer. If the build fails
    (or its request goes away), each caller that shared it builds its own.
    """
    building = _building.setdefault(asyncio.get_running_loop(), {})
    running = building.get(key)
    if running is not None:
        theirs = await asyncio.shield(running)
        return await build() if theirs is _FAILED else cast(T, theirs)
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    building[key] = future
    result: Any = _FAILED
    try:
        result = await build()
        return cast(T, result)
    finally:
        del building[key]
        future.set_result(result)


def _prepare_then_release_connection(
    prepare: Prepare, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> HttpResponseBase | Wait:
    prepared = prepare(request, *args, **kwargs)
    if not isinstance(prepared, Wait):
        return prepared
    # A test's outer transaction (pytest-django) lives on this connection: keep it, and read there.
    in_transaction = connection.in_atomic_block
    if not in_transaction:
        connection.close()
    return replace(prepared, in_transaction=in_transaction)


async def _prepared(
    prepare: Prepare, request: HttpRequest, *args: Any, **kwargs: Any
) -> HttpResponseBase | Wait:
    """``prepare`` run in a thread; if the request goes away meanwhile, a slot it took is given back."""
    running = asyncio.ensure_future(
        sync_to_async(_prepare_then_release_connection)(prepare, request, args, kwargs)
    )
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        running.add_done_callback(_give_back_when_prepared)
        raise


def _give_back_when_prepared(running: asyncio.Future[HttpResponseBase | Wait]) -> None:
    if not running.cancelled() and running.exception() is None:
        prepared = running.result()
        if isinstance(prepared, Wait) and prepared.slot is not None:
            asyncio.ensure_future(sync_to_async(prepared.slot.give_back, thread_sensitive=False)())


async def _answer(
    answer: Answer, request: HttpRequest, wait: Wait, state: JobState | None
) -> HttpResponseBase:
    if not isinstance(answer, SharedAnswer):
        async with gate.answer_turn(request), _sync_slots("answer"):
            return await sync_to_async(answer)(request, wait)

    async def build() -> Any:
        async with gate.answer_turn(request), _sync_slots("answer"):
            return await sync_to_async(answer.build)(request, wait.job_id)

    if state is None:  # gone, or not known: nothing to share on
        return answer.respond(request, wait, await build())
    # The host is part of the key: an answer may hold absolute URLs built from it.
    key = (answer.build, wait.job_id, state, request.build_absolute_uri("/"))
    return answer.respond(request, wait, await shared(key, build))


def wait_view(prepare: Prepare, answer: Answer) -> Callable[..., Coroutine[Any, Any, HttpResponseBase]]:
    """The async view of a waiting endpoint: ``prepare`` (sync: who asks, may they, what to wait
    for) in a thread; the finished answer it returns, or else its ``Wait`` as a coroutine and
    ``answer`` after it.
    """

    async def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        async with _sync_slots("first"):
            prepared = await _prepared(prepare, request, *args, **kwargs)
        if not isinstance(prepared, Wait):
            return prepared  # an error, a finished job, a stream: nothing to wait for here
        renewing = [task for job_id in prepared.jobs if (task := _renewing(prepared, job_id))]
        try:
            gate.release(request)  # a waiting request holds none of its key's turns
            states = await asyncio.gather(
                *(
                    await_job(job_id, prepared.seconds, prepared.done, prepared.in_transaction)
                    for job_id in prepared.jobs
                )
            )
            return await _answer(answer, request, prepared, states[0])
        except asyncio.CancelledError:
            # The client went away (Django cancels the view on its disconnect): a job kept only
            # for this answer is abandoned now, not run to its end and charged.
            if prepared.lease is not None:
                lease = prepared.lease
                await asyncio.shield(
                    asyncio.gather(*(_in_pool_thread(lease.leave, j) for j in prepared.jobs))
                )
            raise
        finally:
            for task in renewing:
                task.cancel()
            if prepared.slot is not None:
                await sync_to_async(prepared.slot.give_back, thread_sensitive=False)()

    # The schema generator and DRF's own checks read these from a DRF view's function.
    for name in ("cls", "initkwargs", "view_class"):
        if hasattr(prepare, name):
            setattr(view, name, getattr(prepare, name))
    return csrf_exempt(view)


def _renewing(wait: Wait, job_id: Any) -> asyncio.Task[None] | None:
    """The task that renews the request's waiter lease of ``job_id`` while it waits (None: it holds none)."""
    lease = wait.lease
    if lease is None:
        return None
    return keep_lease(lease.renew, job_id, lease.every, first_in=lease.every if lease.fresh else 0.0)


def keep_lease(
    renew: Callable[[Any], Any], job_id: Any, every: float, first_in: float = 0.0
) -> asyncio.Task[None]:
    """A task that calls ``renew(job_id)`` every ``every`` seconds, the first after ``first_in``, until
    canceled: a waiter's lease is kept by the clock while its request lives, never by the pace of
    its client (one that stops reading would otherwise let it lapse with its answer half sent)."""

    async def renewing() -> None:
        await asyncio.sleep(first_in)
        while True:
            try:
                await _in_pool_thread(renew, job_id)
            except (InterfaceError, OperationalError) as exc:
                # The next renewal tries again; a lease that lapses meanwhile ends the job.
                log.warning("could not renew the waiter lease of job %s: %s", job_id, exc)
            await asyncio.sleep(every)

    return asyncio.ensure_future(renewing())


def _call_then_release_connection(call: Callable[[Any], Any], job_id: Any) -> None:
    try:
        call(job_id)
    finally:
        if connection.pool is not None:  # type: ignore[attr-defined]
            connection.close()  # back to the pool (ASGI), not kept by this pool thread


async def _in_pool_thread(call: Callable[[Any], Any], job_id: Any) -> None:
    await sync_to_async(_call_then_release_connection, thread_sensitive=False)(call, job_id)


def _read_row(job_id: Any) -> JobState | None:
    for attempt in (1, 2):
        try:
            row = SynthesisJob.objects.filter(pk=job_id).values_list("status", "progress").first()
            break
        except (InterfaceError, OperationalError):
            # This thread's connection broke (database restarted): one retry on a new one.
            connection.close()
            if attempt == 2:
                raise
    if connection.pool is not None:  # type: ignore[attr-defined]
        connection.close()  # back to the pool (ASGI), not kept by this pool thread
    return None if row is None else (str(row[0]), float(row[1]))


async def _read(job_id: Any, share_connection: bool) -> JobState | None:
    """The job's state, read in the loop's thread pool.

    ``share_connection``: the caller runs inside a transaction (a test's), whose
    rows only its own connection sees: read there instead.
    """
    return await sync_to_async(_read_row, thread_sensitive=share_connection)(job_id)


async def _subscribe(job_id: Any) -> Subscription | None:
    """A confirmed subscription to the job's channel, or None when Redis is unreachable."""
    try:
        return await notifications.subscribe(channel(job_id))
    except (RedisError, OSError, NotificationsLost) as exc:
        log.warning("waiting without notifications (polling once a second): %s", exc)
        return None


async def await_job(
    job_id: Any, seconds: float, done: Callable[[JobState], bool], in_transaction: bool
) -> JobState | None:
    """Wait until ``done((status, progress))`` holds, the job is gone, or ``seconds`` have passed;
    return the job's last known state (None: gone).

    ``in_transaction``: whether the caller's connection is inside a transaction
    (a test's), as the sync view saw it: the row is then read on that connection.

    The row is read once after subscribing; after that each notification says
    the job's new state itself, so the row is read again only for one that
    does not (or once a second while Redis is away). The caller reads the
    final state for its answer.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    subscription = await _subscribe(job_id)
    try:
        state = await _read(job_id, in_transaction)
        while state is not None and not done(state):
            left = deadline - loop.time()
            if left <= 0:
                return state
            if subscription is None:
                await asyncio.sleep(min(FALLBACK_POLL_SECONDS, left))
                state = await _read(job_id, in_transaction)
                continue
            try:
                message = await subscription.get(timeout=left)
            except NotificationsLost as exc:
                log.warning("notifications lost while waiting (polling once a second): %s", exc)
                await subscription.close()
                subscription = None
                state = await _read(job_id, in_transaction)  # the change it missed may be the last
                continue
            if message is not None:  # None: the deadline
                state = parse_state(message) or await _read(job_id, in_transaction)
        return state
    finally:
        if subscription is not None:
            await subscription.close()
