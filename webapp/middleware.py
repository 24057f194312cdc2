"""Errors under /api/ and /v1/ are never HTML, whatever raised them."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest, HttpResponse
from psycopg.errors import QueryCanceled
from redis.exceptions import RedisError

from webapp.errors import DomainError, ErrorCode
from webapp.problems import Problem, as_problem, code_for_status, is_api_path, render

log = logging.getLogger(__name__)


class ProblemJsonMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not is_api_path(request) or response.status_code < 400:
            return response
        if "json" in response.get("Content-Type", ""):
            return response
        # Django's own answers (URL not found, method not allowed, ...).
        detail = {404: "No such resource.", 405: f"Method {request.method} not allowed."}.get(
            response.status_code, "The request could not be completed."
        )
        status = response.status_code
        rendered = render(request, Problem(status, code_for_status(status), detail))
        if response.has_header("Allow"):
            rendered["Allow"] = response["Allow"]
        return rendered

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, DomainError | Problem):
            return render(request, Problem.of(exception))
        problem = as_problem(exception) if is_api_path(request) else None
        if problem is not None:
            return render(request, problem)
        if isinstance(exception.__cause__, QueryCanceled):
            # Past this process's statement timeout (TTS_DB_STATEMENT_TIMEOUT_SECONDS): a slow query or
            # one queued behind a lock. The transaction was rolled back; nothing was half-written.
            log.warning("statement timeout on %s: %s", request.path, exception)
            seconds = f"{settings.TTS_DB_STATEMENT_TIMEOUT_SECONDS:g}"
            return render(
                request,
                Problem(
                    503,
                    ErrorCode.SERVICE_UNAVAILABLE,
                    f"The database did not answer this request within {seconds} s; nothing was changed. "
                    "Try again shortly.",
                    retry_after=5,
                ),
            )
        if isinstance(exception, DatabaseError | InterfaceError | RedisError | ConnectionError):
            # A backing service is down: tell the client to come back, never a 500.
            log.warning("backing service unavailable on %s: %s", request.path, exception)
            return render(
                request,
                Problem(
                    503,
                    ErrorCode.SERVICE_UNAVAILABLE,
                    "A backing service is unavailable; try again shortly.",
                    retry_after=5,
                ),
            )
        if is_api_path(request):
            log.exception("unhandled error on %s", request.path)
            return render(request, Problem(500, ErrorCode.SERVER_ERROR, "Internal error."))
        return None


class SyncMiddlewareChain:
    """Last in MIDDLEWARE, sync only: keeps every middleware above it in sync mode under ASGI.

    Django adapts each middleware to the mode of the one below it. With an
    async-capable middleware last, Django's own ones (sessions, CSRF, auth,
    ...) ran in async mode, and each of those hops to a thread for its
    ``process_request`` and again for ``process_response``: about sixteen
    thread hops per request, each a wait for the GIL on a busy process. In
    sync mode the whole chain runs in the request's one thread; async views
    (the waiting ones) are still awaited on the event loop below it.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)
