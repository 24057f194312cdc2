"""Jobs submitted through the service itself (no HTTP), for tests that play the client and the worker."""

from __future__ import annotations

from typing import Any


def submit_espeak(org: Any, text: str = "short text") -> Any:
    """A queued eSpeak job of ``org`` (``len(text)`` characters reserved), as submit_job makes it."""
    from webapp.speech import lifecycle
    from webapp.speech.models import Voice

    request = lifecycle.JobRequest(
        text=text,
        voice=Voice.objects.get(voice_id="espeak-en-us", organization__isnull=True),
        format="wav",
        sample_rate=None,
        params={},
        billable_chars=len(text),
    )
    return lifecycle.submit_job(org, request)[0]
