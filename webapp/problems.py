"""The HTTP edge of errors: codes to statuses, rendered as problem+json or in OpenAI's shape.

Services raise :class:`webapp.errors.DomainError` (a code and a message, no
HTTP). This module is the one place that knows which HTTP status each code
answers with (:data:`STATUS`) and how an error looks on the wire: RFC 9457
``application/problem+json`` under ``/api/``, and OpenAI's
``{"error": {"message", "type", "param", "code"}}`` under ``/v1/``. The DRF
exception handler and the middleware both render through :func:`render`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions as drf_exceptions

from webapp.errors import DomainError, ErrorCode

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_BASE = "https://docs.tts.local/problems/"

C = ErrorCode
# docs/api.md has the same table (tests/integration/api/test_error_codes.py compares them).
STATUS: dict[ErrorCode, int] = {
    **dict.fromkeys(
        (
            C.INVALID_REQUEST,
            C.UNKNOWN_VOICE,
            C.UNKNOWN_MODEL,
            C.UNSUPPORTED_FORMAT,
            C.UNSUPPORTED_SAMPLE_RATE,
            C.UNSUPPORTED_CONTROL,
            C.UNSUPPORTED_LANGUAGE,
            C.INVALID_LANGUAGE,
            C.INVALID_VOICE,
            C.OUT_OF_RANGE,
            C.INVALID_TEXT,
            C.INVALID_ANNOTATION,
            C.INVALID_IDEMPOTENCY_KEY,
            C.INVALID_ID,
            C.INVALID_CURSOR,
            C.INVALID_STATUS,
            C.INVALID_LIMIT,
            C.INVALID_WAIT,
            C.INVALID_SCOPE,
            C.INVALID_AUDIO,
            C.AUDIO_TOO_SHORT,
            C.AUDIO_TOO_LONG,
            C.SAMPLE_RATE_TOO_LOW,
            C.CONSENT_REQUIRED,
            C.CONSENT_PHRASE_REQUIRED,
            C.CONSENT_ATTESTATION_REQUIRED,
            C.INVALID_DICTIONARY,
            C.INVALID_PLS,
        ),
        400,
    ),
    C.UNAUTHENTICATED: 401,
    C.PERMISSION_DENIED: 403,
    C.BUILTIN_VOICE: 403,
    C.NOT_FOUND: 404,
    C.METHOD_NOT_ALLOWED: 405,
    C.NOT_ACCEPTABLE: 406,
    C.AUDIO_NOT_READY: 409,
    C.JOB_FINISHED: 409,
    C.JOB_CANCELED: 409,
    C.IDEMPOTENCY_KEY_IN_USE: 409,
    C.DICTIONARY_IN_USE: 409,
    C.CONSENT_PHRASE_USED: 409,
    C.CONSENT_NOT_READY: 409,
    C.VOICE_NOT_READY: 409,
    C.VOICE_NAME_TAKEN: 409,
    C.CONSENT_REVOKED: 409,
    C.AUDIO_EXPIRED: 410,
    C.CONSENT_PHRASE_EXPIRED: 410,
    C.REQUEST_TOO_LARGE: 413,
    C.UNSUPPORTED_MEDIA_TYPE: 415,
    C.IDEMPOTENCY_KEY_REUSED: 422,
    C.CLONING_UNAVAILABLE: 422,
    C.CONSENT_MISMATCH: 422,
    C.CONSENT_UNCLEAR: 422,
    C.DICTIONARY_LIMIT: 422,
    C.RATE_LIMITED: 429,
    C.QUOTA_EXCEEDED: 429,
    C.KEY_QUOTA_EXCEEDED: 429,
    C.CONCURRENCY_LIMIT: 429,
    C.STORAGE_LIMIT: 429,
    C.TOO_MANY_WAITS: 429,
    C.TOO_MANY_SESSIONS: 429,
    C.INTERACTIVE_LANE_FULL: 429,
    C.SESSION_LIMIT: 429,
    C.TOO_MANY_AUTH_FAILURES: 429,
    C.TOO_MANY_UPLOADS: 429,
    C.SERVER_ERROR: 500,
    C.JOB_FAILED: 500,
    C.NO_WORKER: 503,
    C.ENGINE_UNAVAILABLE: 503,
    C.QUEUE_FULL: 503,
    C.DECODER_BUSY: 503,
    C.SERVICE_UNAVAILABLE: 503,
    C.TIMEOUT: 504,
}
_CODE_FOR_STATUS = {
    400: C.INVALID_REQUEST,
    401: C.UNAUTHENTICATED,
    403: C.PERMISSION_DENIED,
    404: C.NOT_FOUND,
    405: C.METHOD_NOT_ALLOWED,
    406: C.NOT_ACCEPTABLE,
    413: C.REQUEST_TOO_LARGE,
    415: C.UNSUPPORTED_MEDIA_TYPE,
    429: C.RATE_LIMITED,
    503: C.SERVICE_UNAVAILABLE,
}


def code_for_status(status: int) -> ErrorCode:
    """The generic code of an HTTP status raised outside our own code (DRF, Django)."""
    return _CODE_FOR_STATUS.get(status, C.SERVER_ERROR if status >= 500 else C.INVALID_REQUEST)


class Problem(Exception):
    """An error as the HTTP edge answers it: status, code, detail and any further headers.

    Views and services raise DomainError; this is what it becomes on the wire
    (``Problem.of``). Edge code that needs a status of its own or extra
    headers (RateLimit-* on a 429) builds one directly.
    """

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
        self.code = str(code)
        self.message = detail
        self.title = title or self.code.replace("_", " ").capitalize()
        self.retry_after = retry_after
        self.field = field
        self.extra = extra or {}
        # Further response headers (RateLimit-* on a 429, for instance).
        self.extra_headers: dict[str, str] = {}

    @classmethod
    def of(cls, error: DomainError | Problem) -> Problem:
        if isinstance(error, Problem):
            return error
        return cls(
            STATUS[error.code],
            error.code,
            error.message,
            retry_after=error.retry_after,
            field=error.field,
            extra=error.extra,
        )

    @property
    def detail(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": PROBLEM_BASE + self.code,
            "title": self.title,
            "status": self.status,
            "detail": self.message,
            "code": self.code,
        }
        if self.field:
            data["field"] = self.field
        data.update(self.extra)
        return data

    def openai_body(self) -> dict[str, Any]:
        code = "invalid_api_key" if self.status == 401 else str(self.code)
        return {
            "error": {"message": self.message, "type": self._openai_type(), "param": self.field, "code": code}
        }

    def _openai_type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 403:
            return "permission_error"
        if self.code in (C.QUOTA_EXCEEDED, C.KEY_QUOTA_EXCEEDED):
            return "insufficient_quota"
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="api"'
        return headers


def is_openai_path(request: HttpRequest) -> bool:
    return request.path.startswith("/v1/")


def is_api_path(request: HttpRequest) -> bool:
    return request.path.startswith("/api/") or is_openai_path(request)


def render(request: HttpRequest | None, error: DomainError | Problem) -> JsonResponse:
    """The one renderer: OpenAI's shape under /v1/, problem+json everywhere else."""
    problem = Problem.of(error)
    if request is not None and is_openai_path(request):
        response = JsonResponse(problem.openai_body(), status=problem.status)
    else:
        response = JsonResponse(problem.body(), status=problem.status, content_type=PROBLEM_CONTENT_TYPE)
    for key, value in problem.headers().items():
        response[key] = value
    return response


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
    if isinstance(exc, drf_exceptions.ValidationError):
        errors = _flatten_errors(exc.detail)
        field = errors[0][0] if errors else None
        detail = "; ".join(f"{name}: {msg}" if name else msg for name, msg in errors) or "Invalid request."
        return Problem(
            400,
            C.INVALID_REQUEST,
            detail,
            title="Invalid request",
            field=field or None,
            extra={"errors": [{"field": n, "message": m} for n, m in errors]},
        )
    status = exc.status_code
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        status = 401
    retry_after = None
    wait = getattr(exc, "wait", None)
    if isinstance(exc, drf_exceptions.Throttled) and wait is not None:
        retry_after = int(wait) + 1
    return Problem(status, code_for_status(status), str(exc.detail), retry_after=retry_after)


def too_large() -> Problem:
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
    return Problem(413, C.REQUEST_TOO_LARGE, f"The request body is over the limit of {limit:,} bytes.")


def as_problem(exc: Exception) -> Problem | None:
    """Our view of an exception raised while answering, or None when it is not a client's error."""
    if isinstance(exc, DomainError | Problem):
        return Problem.of(exc)
    if isinstance(exc, RequestDataTooBig):
        return too_large()
    if isinstance(exc, drf_exceptions.APIException):
        return problem_from_drf(exc)
    return None


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> JsonResponse | None:
    """DRF exception handler: every error under /api/ and /v1/ is rendered here."""
    problem = as_problem(exc)
    if problem is None:
        # Imported here: rest_framework.views loads the API settings, which import our parsers.
        from rest_framework.views import exception_handler as drf_default_handler

        response = drf_default_handler(exc, context)  # Http404, PermissionDenied
        if response is None:
            return None
        data = response.data
        detail = str(data["detail"]) if isinstance(data, dict) and "detail" in data else "Error."
        problem = Problem(response.status_code, code_for_status(response.status_code), detail)
    request = context.get("request")
    return render(getattr(request, "_request", request), problem)
