"""One API key's requests take turns in each web process, so a burst from one key cannot crowd out the rest.

Under ASGI each request's sync code (middleware, auth, the view) runs in a
thread of its own, and all of a process's threads share one GIL. A burst of
200 requests from one key used to be 200 runnable threads at once: every
other request of the process then waited for the GIL after each of its
queries, and another tenant's plain list took over a second. Here at most
``CLIENT_SLOTS`` requests per key run their sync part at once per process;
the others wait as coroutines, which cost no thread and no CPU. Requests
without a key (health checks, the dashboard, the admin) pass straight through.

A request gives its turn back when its response is returned, or when it
starts waiting for a job (``release``): a long-poll holds no turn while it
waits, and takes one at the key's answer gate to build its answer. The key
is identified by a hash of the whole token, so a client that knows only a
key's public prefix cannot queue behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from asgiref.sync import markcoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from webapp.credentials import MalformedCredential, credential_of_meta

CLIENT_SLOTS = 2  # per key, per process, per phase
CLIENT_ATTRIBUTE = "tts_client"
TURN_ATTRIBUTE = "tts_turn"

GateKey = tuple[bytes, str]  # (client, phase)


@dataclass
class _Gate:
    slots: asyncio.Semaphore
    users: int = 0


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[GateKey, _Gate]] = (
    weakref.WeakKeyDictionary()
)


class Turn:
    """A request's turn at one of its key's gates (phase ``request``: from its start to its response)."""

    def __init__(self, key: GateKey) -> None:
        gates = _gates.setdefault(asyncio.get_running_loop(), {})
        self.key = key
        self.gate = gates.setdefault(key, _Gate(asyncio.Semaphore(CLIENT_SLOTS)))
        self.gate.users += 1
        self.held = False

    async def take(self) -> None:
        await self.gate.slots.acquire()
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.gate.slots.release()

    def close(self) -> None:
        """Give back and forget the gate once no request uses it (no entry per key kept for ever)."""
        self.give_back()
        self.gate.users -= 1
        if self.gate.users == 0:
            _gates.get(asyncio.get_running_loop(), {}).pop(self.key, None)


def client_of(request: HttpRequest) -> bytes | None:
    """Who is asking, for the gate: a digest of the request's key (any form), or None without one.

    Malformed credentials pass ungated like none: authentication answers them at once.
    """
    try:
        credential = credential_of_meta(request.META)
    except MalformedCredential:
        return None
    if credential is None:
        return None
    return hashlib.blake2b(credential.token.encode(), digest_size=16).digest()


def release(request: HttpRequest) -> None:
    """Give the request's turn back now: it is about to wait on a job."""
    turn: Turn | None = getattr(request, TURN_ATTRIBUTE, None)
    if turn is not None:
        turn.give_back()


@contextlib.asynccontextmanager
async def answer_turn(request: HttpRequest) -> AsyncIterator[None]:
    """A turn at the key's answer gate, for the sync part that answers after a wait.

    Its own gate: answers never queue behind the same key's new submits (which
    may wait for their tenant's lock), and one key's burst of answers still
    runs at most ``CLIENT_SLOTS`` at a time per process.
    """
    client: bytes | None = getattr(request, CLIENT_ATTRIBUTE, None)
    if client is None:
        yield
        return
    turn = Turn((client, "answer"))
    try:
        await turn.take()
        yield
    finally:
        turn.close()


class ClientGateMiddleware:
    """First in MIDDLEWARE; async only, so Django awaits it and runs the sync chain below in a thread."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        client = client_of(request)
        if client is None:
            return await self.get_response(request)
        turn = Turn((client, "request"))
        try:
            await turn.take()
            setattr(request, CLIENT_ATTRIBUTE, client)
            setattr(request, TURN_ATTRIBUTE, turn)
            return await self.get_response(request)
        finally:
            turn.close()
