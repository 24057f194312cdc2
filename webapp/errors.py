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
    UNKNOWN_MODEL = "unknown_model"
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
    CONSENT_PHRASE_REQUIRED = "consent_phrase_required"
    CONSENT_ATTESTATION_REQUIRED = "consent_attestation_required"
    INVALID_DICTIONARY = "invalid_dictionary"
    INVALID_PLS = "invalid_pls"
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
    DICTIONARY_IN_USE = "dictionary_in_use"
    CONSENT_PHRASE_USED = "consent_phrase_used"
    CONSENT_NOT_READY = "consent_not_ready"
    VOICE_NOT_READY = "voice_not_ready"
    VOICE_NAME_TAKEN = "voice_name_taken"
    CONSENT_REVOKED = "consent_revoked"
    CONSENT_PHRASE_EXPIRED = "consent_phrase_expired"
    AUDIO_EXPIRED = "audio_expired"
    REQUEST_TOO_LARGE = "request_too_large"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    CLONING_UNAVAILABLE = "cloning_unavailable"
    CONSENT_MISMATCH = "consent_mismatch"
    CONSENT_UNCLEAR = "consent_unclear"
    DICTIONARY_LIMIT = "dictionary_limit"
    # 429: limits
    RATE_LIMITED = "rate_limited"
    QUOTA_EXCEEDED = "quota_exceeded"
    KEY_QUOTA_EXCEEDED = "key_quota_exceeded"  # the key's own monthly characters (ApiKey.monthly_characters)
    CONCURRENCY_LIMIT = "concurrency_limit"
    STORAGE_LIMIT = "storage_limit"
    TOO_MANY_WAITS = "too_many_waits"
    TOO_MANY_SESSIONS = "too_many_sessions"  # realtime sessions open at once, per key or tenant
    # An engine's interactive work already waits as long as it may (services/lanes.py): a new
    # session, context or streamed /v1/audio/speech request is refused at once, not served late.
    INTERACTIVE_LANE_FULL = "interactive_lane_full"
    SESSION_LIMIT = "session_limit"  # a realtime session's own bounds: contexts, buffer, messages, length
    TOO_MANY_AUTH_FAILURES = "too_many_auth_failures"
    TOO_MANY_UPLOADS = "too_many_uploads"
    # 5xx
    SERVER_ERROR = "server_error"
    JOB_FAILED = "job_failed"
    NO_WORKER = "no_worker"
    ENGINE_UNAVAILABLE = "engine_unavailable"  # a worker lives but cannot load the model
    QUEUE_FULL = "queue_full"
    DECODER_BUSY = "decoder_busy"
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


class JobFailureCode(StrEnum):
    """What a failed job's ``error.code`` holds: why it ended ``failed``. docs/api.md has a row for each.

    A failed job is read like any other (``200``, ``status: "failed"``); these codes have
    no HTTP status, so they are not :class:`ErrorCode` members. Some values are both,
    on purpose: the engine's own refusals at run time (``invalid_text``, ``unknown_voice``,
    ...) carry the code the API answers (``400``, ``422``) for the same fault, and
    ``timeout`` names both a job that ran past its limits (here) and the OpenAI
    endpoint's wait that ran out (``ErrorCode.TIMEOUT``, 504). A client can read one
    code the same way wherever it meets it.
    synth cannot import this module; its codes are ``synth.errors.SYNTH_ERROR_CODES``
    and tests/unit/test_failure_codes.py checks each maps to a member (:meth:`of_synth`).
    """

    # Written by the service (worker, reaper, housekeeping, voice deletion)
    TIMEOUT = "timeout"  # past the hard time limit, stalled, or over the soft CPU-time limit; not retried
    WORKER_LOST = "worker_lost"  # its worker died or was lost on every one of TTS_JOB_MAX_ATTEMPTS attempts
    QUEUE_TIMEOUT = "queue_timeout"  # no worker took it within TTS_JOB_MAX_QUEUE_SECONDS
    RESOURCE_EXHAUSTED = "resource_exhausted"  # out of memory, also on its retry on a fresh worker
    DISK_FULL = "disk_full"  # the audio storage is full (ENOSPC, EDQUOT or EFBIG while writing)
    STORAGE_ERROR = "storage_error"  # any other failure to write the audio
    VOICE_DELETED = "voice_deleted"  # its voice was deleted while the job was still queued
    CONSENT_REVOKED = "consent_revoked"  # its cloned voice's consent was revoked before it finished
    SYNTHESIS_FAILED = "synthesis_failed"  # an unexpected error (a bug, a failed sentence); the fallback
    # Raised by synth as SynthError.code (same values as synth.errors)
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the engine cannot run here (library, device, voice load)
    CLONING_UNAVAILABLE = "cloning_unavailable"  # a prompt for a voice that cannot clone (also ErrorCode)
    INVALID_TEXT = "invalid_text"  # the engine refused the text (also ErrorCode, 400 at submit)
    INVALID_ANNOTATION = "invalid_annotation"  # a malformed pronunciation annotation (also ErrorCode)
    UNKNOWN_VOICE = "unknown_voice"  # the worker's engines do not have the voice (also ErrorCode)
    UNSUPPORTED_FORMAT = "unsupported_format"  # the encoder does not offer the format (also ErrorCode)
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"  # the format cannot carry the rate (also ErrorCode)
    UNSUPPORTED_CONTROL = "unsupported_control"  # a control the voice does not take (also ErrorCode)
    UPSTREAM_FAILED = "upstream_failed"  # a remote model's upstream refused a sentence or answered no PCM
    UPSTREAM_TIMEOUT = "upstream_timeout"  # a remote model's upstream went silent past its read timeout

    @classmethod
    def of_synth(cls, code: str) -> JobFailureCode:
        """The member for a ``SynthError.code``; a code with no member is ``synthesis_failed``.

        Not for ``canceled`` (synth's Cancelled): the worker ends such a run canceled, not failed.
        """
        try:
            return cls(code)
        except ValueError:
            return cls.SYNTHESIS_FAILED
