"""Health answers, no internals shown:

- ``GET /healthz``: database, Redis and a recent worker heartbeat; 503 when any fails (the
  local stack, supervisors and monitoring: "can this site synthesise now").
- ``GET /healthz/ready``: web readiness, database and Redis; the worker census is in the body
  (``workers``: ``ok``, ``none``, ``unknown``) but never makes it a 503, so a web pod stays in
  its Service while a worker pool is scaled to zero (Kubernetes' readiness probe).
- ``GET /healthz/live``: the process answers; no check (a liveness probe: an outage of
  PostgreSQL or Redis must not restart every web pod).

Under ASGI (:func:`answered_first`, webapp/asgi.py) a GET or HEAD of /healthz
is answered before Django's handler: its checks run in a thread of their
own, without the request thread and middleware chain every Django request
gets. A probe then waits for one short check, not for a turn of the
GIL among a busy process's request threads: under the waiting benchmark's
load its p99 was 150-190 ms through Django (docs/decisions.md). The Django
view below answers the same way where there is no ASGI server (tests' client,
WSGI).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from webapp import redis_clients
from webapp.audit.context import HEADER as REQUEST_ID_HEADER
from webapp.audit.context import request_id_from
from webapp.metrics.http import record
from webapp.speech import heartbeat
from webapp.speech.services.waiting import shared

log = logging.getLogger(__name__)

PATH = "/healthz"
READY_PATH = "/healthz/ready"
LIVE_PATH = "/healthz/live"
# Each path's metrics label: its URL pattern's name, as Django's answers are counted.
VIEWS = {PATH: "healthz", READY_PATH: "healthz_ready", LIVE_PATH: "healthz_live"}
_CHECKS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthz")  # its thread starts with a check
RETRY_AFTER = "10"
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _check_db() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception as exc:
        log.warning("healthz: database check failed: %s", exc)
        return False


def _check_redis() -> bool:
    try:
        return bool(redis_clients.heartbeats().ping())
    except Exception as exc:
        log.warning("healthz: redis check failed: %s", exc)
        return False


def _check_workers() -> bool:
    # A child being replaced counts, as it does for submit's no_worker check: its node serves
    # again once the replacement has loaded, and jobs queue meanwhile. Counting only "ready"
    # children failed the check whenever every child of the only node was recycling at once.
    try:
        return any(w.get("state") in heartbeat.SERVING_STATES for w in heartbeat.live_workers())
    except Exception:
        return False


def _answer(checks: dict[str, bool]) -> tuple[dict[str, object], int]:
    failing = [name for name, ok in checks.items() if not ok]
    body: dict[str, object] = {
        "status": "ok" if not failing else "fail",
        "checks": {name: ("ok" if ok else "fail") for name, ok in checks.items()},
    }
    if failing:
        body["failing"] = failing
    return body, 200 if not failing else 503


def check() -> tuple[dict[str, object], int]:
    """The body and status of a /healthz answer."""
    checks = {"db": _check_db(), "redis": _check_redis()}
    checks["workers"] = checks["redis"] and _check_workers()
    return _answer(checks)


def check_ready() -> tuple[dict[str, object], int]:
    """The body and status of a /healthz/ready answer: workers reported, not checked.

    ``engines_unavailable``: the engines a live worker is meant to serve but cannot load (names
    only: why is for the operators, on the operations page and in the worker's log).
    """
    checks = {"db": _check_db(), "redis": _check_redis()}
    body, status = _answer(checks)
    if not checks["redis"]:
        body["workers"] = "unknown"
    else:
        body["workers"] = "ok" if _check_workers() else "none"
        unavailable = _unavailable_engines()
        if unavailable:
            body["engines_unavailable"] = unavailable
    return body, status


def _unavailable_engines() -> list[str]:
    try:
        beats = heartbeat.live_workers()
    except Exception:
        return []
    return sorted({str(e) for b in beats if isinstance(b.get("unavailable"), dict) for e in b["unavailable"]})


def check_live() -> tuple[dict[str, object], int]:
    return {"status": "ok"}, 200


# Looked up when called, so a test that replaces ``check`` replaces what the ASGI path runs.
CHECKS: dict[str, Callable[[], tuple[dict[str, object], int]]] = {
    PATH: lambda: check(),
    READY_PATH: lambda: check_ready(),
}


def _response(body: dict[str, object], status: int) -> JsonResponse:
    response = JsonResponse(body, status=status)
    if status != 200:
        response["Retry-After"] = RETRY_AFTER
    return response


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return _response(*check())


@never_cache
@require_GET
def healthz_ready(request: HttpRequest) -> JsonResponse:
    return _response(*check_ready())


@never_cache
@require_GET
def healthz_live(request: HttpRequest) -> JsonResponse:
    return _response(*check_live())


def _check_in_own_thread(path: str) -> tuple[dict[str, object], int]:
    try:
        return CHECKS[path]()
    finally:
        try:
            connection.close()  # back to the pool: this thread keeps no connection of its own
        except Exception as exc:  # a broken connection's close must not turn the answer into a 500
            log.warning("healthz: closing the database connection failed: %s", exc)


def _request_id(scope: Scope) -> str:
    name = REQUEST_ID_HEADER.lower().encode()
    given = next((value for key, value in scope.get("headers", ()) if key == name), None)
    return request_id_from(None if given is None else given.decode("latin-1"))


async def answer(scope: Scope, send: Send) -> None:
    """Answer a GET or HEAD of a health path as the Django view would (headers, metrics, request id)."""
    started = time.perf_counter()
    path = scope["path"]
    if path == LIVE_PATH:
        body, status = check_live()  # the loop answering is the whole check: no thread, no wait
    else:
        # Probes of a path that arrive while its check runs share it: one check at a time per
        # process, however many probes there are and however long a database that hangs keeps
        # it. Its thread is its own, not the loop's pool, where it would queue behind a burst
        # of waiters' reads.
        check_now = sync_to_async(_check_in_own_thread, thread_sensitive=False, executor=_CHECKS)
        body, status = await shared(("healthz", path), lambda: check_now(path))
    # The view's response, with what this path skips added: @never_cache's headers, the
    # security middleware's nosniff and the request id.
    response = _response(body, status)
    add_never_cache_headers(response)
    response["X-Content-Type-Options"] = "nosniff"
    response[REQUEST_ID_HEADER] = _request_id(scope)
    content = response.content
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]
    headers.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else content})
    record(VIEWS[path], scope["method"], status, started)


def answered_first(app: ASGIApp) -> ASGIApp:
    """``app`` with GET and HEAD of the health paths answered by :func:`answer` (anything else goes to ``app``)."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in VIEWS and scope["method"] in ("GET", "HEAD"):
            await answer(scope, send)
        else:
            await app(scope, receive, send)

    return application
