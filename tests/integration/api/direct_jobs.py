"""Jobs submitted through the service itself (no HTTP), for tests that play the client and the worker."""

from __future__ import annotations

import datetime as dt
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


def job_row(org: Any, status: str, at: dt.datetime, *, chars: int, engine: str, **fields: Any) -> Any:
    """A job row of ``org`` made as it is, in any status (no reservation, no message): for read tests."""
    from webapp.speech.models import SynthesisJob

    return SynthesisJob.objects.create(
        organization=org,
        voice_name=f"{engine}-voice",
        engine=engine,
        text="x" * chars,
        text_chars=chars,
        format="wav",
        status=status,
        created_at=at,
        **fields,
    )
