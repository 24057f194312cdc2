"""RFC 9457 problem details, shared by the API views and the services.

Services raise :class:`Problem` for anything a client did wrong or a limit it
hit; views and the DRF exception handler turn it into ``application/problem+json``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_BASE = "https://docs.tts.local/problems/"


class Problem(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        title: str | None = None,
        retry_after: int | None = None,
        field: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title or code.replace("_", " ").capitalize()
        self.retry_after = retry_after
        self.field = field
        self.extra = extra or {}
        # Further response headers (RateLimit-* on a 429, for instance).
        self.extra_headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": PROBLEM_BASE + self.code,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        if self.field:
            data["field"] = self.field
        data.update(self.extra)
        return data

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


def problem_response(problem: Problem) -> JsonResponse:
    response = JsonResponse(problem.body(), status=problem.status, content_type=PROBLEM_CONTENT_TYPE)
    for key, value in problem.headers().items():
        response[key] = value
    return response


_DRF_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def _flatten_errors(detail: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(detail, dict):
        out: list[tuple[str, str]] = []
        for key, value in detail.items():
            name = key if not prefix else f"{prefix}.{key}"
            if key == "non_field_errors":
                name = prefix
            out.extend(_flatten_errors(value, name))
        return out
    if isinstance(detail, list):
        out = []
        for index, value in enumerate(detail):
            name = prefix if not isinstance(value, dict | list) else f"{prefix}[{index}]"
            out.extend(_flatten_errors(value, name))
        return out
    return [(prefix, str(detail))]


def problem_from_drf(exc: drf_exceptions.APIException) -> Problem:
    status = exc.status_code
    if isinstance(exc, drf_exceptions.ValidationError):
        errors = _flatten_errors(exc.detail)
        field = errors[0][0] if errors else None
        detail = "; ".join(f"{name}: {msg}" if name else msg for name, msg in errors) or "Invalid request."
        return Problem(
            400,
            "invalid_request",
            detail,
            title="Invalid request",
            field=field or None,
            extra={"errors": [{"field": n, "message": m} for n, m in errors]},
        )
    code = _DRF_CODES.get(status, "error")
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        status, code = 401, "unauthenticated"
    retry_after = None
    wait = getattr(exc, "wait", None)
    if isinstance(exc, drf_exceptions.Throttled) and wait is not None:
        retry_after = int(wait) + 1
    return Problem(status, code, str(exc.detail), retry_after=retry_after)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: every error under /api/ is problem+json."""
    if isinstance(exc, Problem):
        problem = exc
    elif isinstance(exc, RequestDataTooBig):
        problem = too_large()
    elif isinstance(exc, drf_exceptions.APIException):
        problem = problem_from_drf(exc)
    else:
        # Imported here: rest_framework.views loads the API settings, which import our parsers.
        from rest_framework.views import exception_handler as drf_default_handler

        response = drf_default_handler(exc, context)  # Http404, PermissionDenied
        if response is None:
            return None
        problem = Problem(
            response.status_code, _DRF_CODES.get(response.status_code, "error"), _detail(response)
        )
    response = Response(problem.body(), status=problem.status, headers=problem.headers())
    response.content_type = PROBLEM_CONTENT_TYPE
    if problem.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def too_large() -> Problem:
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
    return Problem(413, "request_too_large", f"The request body is over the limit of {limit:,} bytes.")


def _detail(response: Response) -> str:
    data = response.data
    if isinstance(data, dict) and "detail" in data:
        return str(data["detail"])
    return "Error."


def is_api_path(request: HttpRequest) -> bool:
    return request.path.startswith("/api/") or request.path.startswith("/v1/")
