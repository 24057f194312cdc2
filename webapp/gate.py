"""One API key's requests take turns in each web process, so a burst from one key cannot crowd out the rest.

Under ASGI each request's sync code (middleware, auth, the view) runs in a
thread of its own, and all of a process's threads share one GIL. A burst of
200 requests from one key used to be 200 runnable threads at once: every
other request of the process then waited for the GIL after each of its
queries, and another tenant's plain list took over a second. Here at most
``CLIENT_SLOTS`` requests per key run their sync part at once per process;
the others wait as coroutines, which cost no thread and no CPU. Requests
without a key (health checks, the dashboard, the admin) pass straight through.

A request gives its slot back when its response is returned, or earlier
when it starts waiting for a job (``release``): a long-poll holds no slot
while it waits. The key is identified by a hash of the whole token, so a
client that knows only a key's public prefix cannot queue behind it.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asgiref.sync import markcoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

CLIENT_SLOTS = 2
RELEASE_ATTRIBUTE = "tts_release_gate"


@dataclass
class _Gate:
    slots: asyncio.Semaphore
    users: int = 0


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[bytes, _Gate]] = weakref.WeakKeyDictionary()


def client_of(request: HttpRequest) -> bytes | None:
    """Who is asking, for the gate: a digest of the Bearer token, or None without one."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header[:7].lower() != "bearer ":
        return None
    return hashlib.blake2b(header[7:].strip().encode(), digest_size=16).digest()


def release(request: HttpRequest) -> None:
    """Give the request's slot back now (it is about to wait on a job); later calls do nothing."""
    give_back: Callable[[], None] | None = getattr(request, RELEASE_ATTRIBUTE, None)
    if give_back is not None:
        give_back()


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
        gates = _gates.setdefault(asyncio.get_running_loop(), {})
        gate = gates.setdefault(client, _Gate(asyncio.Semaphore(CLIENT_SLOTS)))
        gate.users += 1
        held = False

        def give_back() -> None:
            nonlocal held
            if held:
                held = False
                gate.slots.release()

        try:
            await gate.slots.acquire()
            held = True
            setattr(request, RELEASE_ATTRIBUTE, give_back)
            return await self.get_response(request)
        finally:
            give_back()
            gate.users -= 1
            if gate.users == 0:
                gates.pop(client, None)
