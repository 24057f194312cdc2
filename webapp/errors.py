"""Domain errors: every error code a client can see, defined once.

Service modules raise :class:`DomainError` with a stable code from
:class:`ErrorCode` and a human message; they know nothing of HTTP. The edge
(``webapp/problems.py``) maps each code to an HTTP status and renders it as
problem+json on ``/api/`` or in OpenAI's error shape on ``/v1/``.
docs/api.md lists the same codes; a test keeps the two in step.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Stable codes. Adding one means adding its HTTP status in problems.py and a row in docs/api.md."""

    # 400: bad input
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_VOICE = "unknown_voice"
    UNSUPPORTED_FORMAT = "unsupported_format"
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    UNSUPPORTED_CONTROL = "unsupported_control"
    UNSUPPORTED_LANGUAGE = "unsupported_language"
    INVALID_LANGUAGE = "invalid_language"
    INVALID_VOICE = "invalid_voice"
    OUT_OF_RANGE = "out_of_range"
    INVALID_TEXT = "invalid_text"
    INVALID_ANNOTATION = "invalid_annotation"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    INVALID_ID = "invalid_id"
    INVALID_CURSOR = "invalid_cursor"
    INVALID_STATUS = "invalid_status"
    INVALID_LIMIT = "invalid_limit"
    INVALID_WAIT = "invalid_wait"
    INVALID_SCOPE = "invalid_scope"
    INVALID_AUDIO = "invalid_audio"
    AUDIO_TOO_SHORT = "audio_too_short"
    AUDIO_TOO_LONG = "audio_too_long"
    SAMPLE_RATE_TOO_LOW = "sample_rate_too_low"
    CONSENT_REQUIRED = "consent_required"
    # 401 / 403 / 404 / 405 / 406 / 415
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    BUILTIN_VOICE = "builtin_voice"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    # 409 / 410 / 413 / 422
    AUDIO_NOT_READY = "audio_not_ready"
    JOB_FINISHED = "job_finished"
    JOB_CANCELED = "job_canceled"
    IDEMPOTENCY_KEY_IN_USE = "idempotency_key_in_use"
    AUDIO_EXPIRED = "audio_expired"
    REQUEST_TOO_LARGE = "request_too_large"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    CLONING_UNAVAILABLE = "cloning_unavailable"
    # 429: limits
    RATE_LIMITED = "rate_limited"
    QUOTA_EXCEEDED = "quota_exceeded"
    CONCURRENCY_LIMIT = "concurrency_limit"
    STORAGE_LIMIT = "storage_limit"
    TOO_MANY_WAITS = "too_many_waits"
    # 5xx
    SERVER_ERROR = "server_error"
    JOB_FAILED = "job_failed"
    NO_WORKER = "no_worker"
    QUEUE_FULL = "queue_full"
    SERVICE_UNAVAILABLE = "service_unavailable"
    TIMEOUT = "timeout"


class DomainError(Exception):
    """Something the client did wrong or a limit it hit, in words a person understands."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        retry_after: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.extra = extra or {}
