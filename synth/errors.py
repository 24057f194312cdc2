"""Errors raised by the synthesis library.

Every error carries a stable machine ``code`` (what an API answers with) and a
human ``message``; callers never need to parse the message.
"""

from __future__ import annotations

from typing import Any


class SynthError(Exception):
    """Base class: ``code`` is machine-readable, ``message`` is for people."""

    code: str = "synth_error"

    def __init_subclass__(cls, code: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code:
            cls.code = code

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class InvalidText(SynthError, code="invalid_text"):
    """The text is empty, not a string, or holds characters no engine can speak."""


class AnnotationError(InvalidText, code="invalid_annotation"):
    """A malformed pronunciation annotation; ``position`` is the 0-based character index."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at character position {position}")
        self.position = position


class UnknownVoice(SynthError, code="unknown_voice"):
    """No installed engine has the requested voice (or it cannot be selected)."""


class UnsupportedFormat(SynthError, code="unsupported_format"):
    """An output format the encoder does not offer (see ``synth.registry.FORMATS``)."""


class UnsupportedSampleRate(SynthError, code="unsupported_sample_rate"):
    """A sample rate outside what the chosen format can carry."""


class UnsupportedControl(SynthError, code="unsupported_control"):
    """A control (speed, pitch, seed, language ...) that is out of range or not a value the voice takes."""


class EngineUnavailable(SynthError, code="engine_unavailable"):
    """The engine cannot run here: its library or device (CUDA) is missing, or a voice failed to load."""


class Cancelled(SynthError, code="canceled"):
    """``should_cancel`` returned True between chunks."""

    def __init__(self, message: str = "synthesis was canceled") -> None:
        super().__init__(message)


class UpstreamFailed(SynthError, code="upstream_failed"):
    """A remote model's upstream refused a sentence, answered no PCM, or no replica was reachable."""


class UpstreamTimeout(SynthError, code="upstream_timeout"):
    """A remote model's upstream sent nothing for longer than the model's read timeout."""


class AudioRejected(SynthError, code="audio_rejected"):
    """An uploaded voice prompt that breaks one of the upload limits."""

    reason: str = ""  # which limit: upload_too_large, audio_too_long, ... (synth.prompt.UPLOAD_CODES)


# Codes raised without a class of their own, as ``SomeError(message, code)``.
AD_HOC_CODES: tuple[str, ...] = (
    "synthesis_failed",  # SynthError: a pass that failed (synth.engines.piper_torch)
    "cloning_unavailable",  # EngineUnavailable: a voice prompt for a voice that cannot clone (synth.request)
)


def _subclasses(cls: type[SynthError]) -> list[type[SynthError]]:
    found: list[type[SynthError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


# Every code a SynthError of this library can carry: the classes above and AD_HOC_CODES.
# The refusals of a voice prompt (synth.prompt.PromptRejected) carry synth.prompt.UPLOAD_CODES
# and analysis codes instead, which never reach a job. webapp maps these to its
# JobFailureCode; tests/unit/test_failure_codes.py checks the two agree.
SYNTH_ERROR_CODES: frozenset[str] = frozenset(
    {SynthError.code, *(sub.code for sub in _subclasses(SynthError)), *AD_HOC_CODES}
)
