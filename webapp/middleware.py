"""Errors under /api/ and /v1/ are never HTML, whatever raised them."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest, HttpResponse, JsonResponse
from redis.exceptions import RedisError

from webapp.problems import Problem, is_api_path, problem_response, too_large

log = logging.getLogger(__name__)

_STATUS_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    400: "bad_request",
    403: "forbidden",
    500: "server_error",
}


def openai_error(
    status: int, message: str, type_: str, code: str | None, param: str | None = None
) -> JsonResponse:
    return JsonResponse(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}, status=status
    )


class ProblemJsonMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not is_api_path(request) or response.status_code < 400:
            return response
        content_type = response.get("Content-Type", "")
        if "json" in content_type:
            return response
        code = _STATUS_CODES.get(response.status_code, "error")
        detail = {404: "No such resource.", 405: f"Method {request.method} not allowed."}.get(
            response.status_code, "The request could not be completed."
        )
        return self._render(request, Problem(response.status_code, code, detail), response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, Problem):
            return self._render(request, exception, None)
        if isinstance(exception, RequestDataTooBig) and is_api_path(request):
            return self._render(request, too_large(), None)
        if isinstance(exception, DatabaseError | InterfaceError | RedisError | ConnectionError):
            # A backing service is down: tell the client to come back, never a 500.
            log.warning("backing service unavailable on %s: %s", request.path, exception)
            return self._render(
                request,
                Problem(
                    503,
                    "service_unavailable",
                    "A backing service is unavailable; try again shortly.",
                    retry_after=5,
                ),
                None,
            )
        if is_api_path(request):
            log.exception("unhandled error on %s", request.path)
            return self._render(request, Problem(500, "server_error", "Internal error."), None)
        return None

    def _render(self, request: HttpRequest, problem: Problem, original: HttpResponse | None) -> HttpResponse:
        if request.path.startswith("/v1/"):
            kind = "invalid_request_error" if problem.status < 500 else "server_error"
            response: HttpResponse = openai_error(
                problem.status, problem.detail, kind, problem.code, problem.field
            )
            for key, value in problem.headers().items():
                response[key] = value
        else:
            response = problem_response(problem)
        if original is not None and original.has_header("Allow"):
            response["Allow"] = original["Allow"]
        return response
