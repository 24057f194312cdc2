"""Waiting for a job to change without holding a thread, a connection, or polling PostgreSQL.

A waiter subscribes to the job's channel first (over its process's one shared Redis connection,
``api.notifications``) and then reads the row, so no
change between the two is missed; after that it reads the row only when a
notification arrives (``services.notify``), or at its deadline. If Redis is
away it falls back to reading the row once a second. The long-poll and the
OpenAI endpoint both wait here; under the ASGI server the wait is a coroutine.

Before it waits, a request gives back the database connection its sync part
used (Django would close it only once the response is sent), and it takes
one of its tenant's wait slots (``services.waits``), given back however the
request ends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError

from webapp import gate
from webapp.speech.api import notifications
from webapp.speech.api.notifications import NotificationsLost, Subscription
from webapp.speech.models import SynthesisJob
from webapp.speech.services import waits
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
WAIT_ATTRIBUTE = "tts_wait"
SLOT_ATTRIBUTE = "tts_wait_slot"


T = TypeVar("T")


@dataclass
class SharedAnswer:
    """An answer after a wait whose costly part the waiters of one job share.

    ``build`` (sync, in a thread, with a database connection) reads and
    serialises the job; ``respond`` (in the event loop, no queries) turns the
    job id and what was built into one request's response. Waiters of a job woken by the same
    change in one process run ``build`` once: a burst of long-polls on one job
    used to read and serialise the same row once each, one key's answers two
    at a time, and the last of them waited for all the others.
    """

    build: Callable[[HttpRequest, Any], Any]
    respond: Callable[[HttpRequest, Any, Any, HttpResponseBase], HttpResponseBase]


Answer = Callable[[HttpRequest, Any, HttpResponseBase], HttpResponseBase] | SharedAnswer


@dataclass(frozen=True)
class PendingWait:
    job_id: Any
    seconds: float
    done: Callable[[JobState], bool]
    # The view ran inside a transaction (a test's): the wait reads the row on that connection.
    in_transaction: bool = False


def _django_request(request: Any) -> HttpRequest:
    return getattr(request, "_request", request)  # a DRF Request wraps Django's (webapp/private_apis.py)


def reserve_wait(request: Any, organization: Organization, seconds: float) -> None:
    """Take a wait slot of the tenant before anything is done for this request (429 when none is free)."""
    token = waits.acquire(organization, seconds)
    setattr(_django_request(request), SLOT_ATTRIBUTE, (organization.pk, token))


def request_to_wait(request: Any, job_id: Any, seconds: float, done: Callable[[JobState], bool]) -> None:
    """Ask the async view around a sync DRF view to wait for the job before answering."""
    pending = PendingWait(job_id, seconds, done, connection.in_atomic_block)
    setattr(_django_request(request), WAIT_ATTRIBUTE, pending)


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _sync_slots(phase: str) -> asyncio.Semaphore:
    per_loop = _slots.setdefault(asyncio.get_running_loop(), {})
    if phase not in per_loop:
        per_loop[phase] = asyncio.Semaphore(SYNC_SLOTS)
    return per_loop[phase]


def _view_then_release_connection(
    view: Callable[..., HttpResponseBase], request: HttpRequest, *args: Any, **kwargs: Any
) -> HttpResponseBase:
    response = view(request, *args, **kwargs)
    # A test's outer transaction (pytest-django) lives on this connection: keep it.
    if getattr(request, WAIT_ATTRIBUTE, None) is not None and not connection.in_atomic_block:
        connection.close()
    return response


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


async def _answer(
    answer: Answer, request: HttpRequest, job_id: Any, state: JobState | None, first: HttpResponseBase
) -> HttpResponseBase:
    if not isinstance(answer, SharedAnswer):
        async with gate.answer_turn(request), _sync_slots("answer"):
            return await sync_to_async(answer)(request, job_id, first)

    async def build() -> Any:
        async with gate.answer_turn(request), _sync_slots("answer"):
            return await sync_to_async(answer.build)(request, job_id)

    if state is None:  # gone, or not known: nothing to share on
        return answer.respond(request, job_id, await build(), first)
    # The host is part of the key: an answer may hold absolute URLs built from it.
    key = (answer.build, job_id, state, request.build_absolute_uri("/"))
    return answer.respond(request, job_id, await shared(key, build), first)


def then_wait(view: Callable[..., HttpResponseBase], answer: Answer) -> Callable[..., Any]:
    """An async view: run the sync DRF ``view`` (auth, scope, rate, validation) in a thread, then,
    if it asked to wait, wait as a coroutine and build the final answer with ``answer`` in a thread.
    """

    async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        first: HttpResponseBase | None = None
        try:
            async with _sync_slots("first"):
                first = await sync_to_async(_view_then_release_connection)(view, request, *args, **kwargs)
            pending: PendingWait | None = getattr(request, WAIT_ATTRIBUTE, None)
            if pending is None or first.status_code >= 300:
                return first
            gate.release(request)  # a waiting request holds none of its key's turns
            state = await await_job(pending.job_id, pending.seconds, pending.done, pending.in_transaction)
            return await _answer(answer, request, pending.job_id, state, first)
        finally:
            slot = getattr(request, SLOT_ATTRIBUTE, None)
            # Django's private list of what closing the response calls (webapp/private_apis.py).
            closers = getattr(first, "_resource_closers", None)
            if slot is not None and first is not None and first.streaming and closers is not None:
                # A streamed answer waits while it streams: its slot goes back when the response closes.
                closers.append(functools.partial(waits.release, *slot))
            elif slot is not None:
                await sync_to_async(waits.release, thread_sensitive=False)(*slot)

    # The schema generator and DRF's own checks read these from the view function.
    async_view.__dict__.update(
        {k: v for k, v in view.__dict__.items() if k in ("cls", "initkwargs", "view_class")}
    )
    return csrf_exempt(async_view)


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
