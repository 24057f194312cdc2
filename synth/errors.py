"""Errors raised by the synthesis library.

Every error carries a stable machine ``code`` (what an API answers with) and a
human ``message``; callers never need to parse the message.
"""

from __future__ import annotations


class SynthError(Exception):
    """Base class: ``code`` is machine-readable, ``message`` is for people."""

    code: str = "synth_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class InvalidText(SynthError):
    code = "invalid_text"


class AnnotationError(InvalidText):
    """A malformed pronunciation annotation; ``position`` is the 0-based character index."""

    code = "invalid_annotation"

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at character position {position}")
        self.position = position


class UnknownVoice(SynthError):
    code = "unknown_voice"


class UnsupportedFormat(SynthError):
    code = "unsupported_format"


class UnsupportedSampleRate(SynthError):
    code = "unsupported_sample_rate"


class UnsupportedControl(SynthError):
    code = "unsupported_control"


class EngineUnavailable(SynthError):
    code = "engine_unavailable"


class Cancelled(SynthError):
    code = "canceled"

    def __init__(self, message: str = "synthesis was canceled") -> None:
        super().__init__(message)


class AudioRejected(SynthError):
    code = "audio_rejected"
    reason: str = ""  # which limit: upload_too_large, audio_too_long, ... (synth.prompt.UPLOAD_CODES)


__all__ = [
    "AnnotationError",
    "AudioRejected",
    "Cancelled",
    "EngineUnavailable",
    "InvalidText",
    "SynthError",
    "UnknownVoice",
    "UnsupportedControl",
    "UnsupportedFormat",
    "UnsupportedSampleRate",
]
