"""Every webhook event, made through the code paths that make them in production.

Jobs go through ``speech.lifecycle`` (submit, claim, complete / fail / cancel) with
no synthesis: the events are the transitions', not the engine's. Voices through
``speech.services.prompts`` (an analysis that finishes, one that is rejected).
usage.threshold from the completions' charges on a plan of 100 characters a month.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

ESPEAK = "espeak-en-us"


def _submit(org: Any, text: str, webhook_url: str = "") -> Any:
    from webapp.speech import lifecycle
    from webapp.speech.models import Voice

    voice = Voice.objects.get(voice_id=ESPEAK)
    request = lifecycle.JobRequest(
        text=text,
        voice=voice,
        format="wav",
        sample_rate=None,
        params={},
        billable_chars=len(text),
        webhook_url=webhook_url,
    )
    return lifecycle.submit_job(org, request)[0]


def succeed(org: Any, text: str, webhook_url: str = "") -> Any:
    from webapp.speech import lifecycle

    job = _submit(org, text, webhook_url)
    claimed = lifecycle.claim_job(job.id, "test:0")
    assert claimed is not None
    done = lifecycle.complete_job(
        job.id,
        claimed.claim_token,
        audio_path="jobs/none.wav",
        audio_bytes=1,
        duration_seconds=0.5,
        metrics={},
        applied_instructions={},
    )
    assert done
    return job


def fail(org: Any, webhook_url: str = "") -> Any:
    from webapp.errors import JobFailureCode
    from webapp.speech import lifecycle

    job = _submit(org, "Fail me.", webhook_url)
    assert lifecycle.fail_job(job.id, JobFailureCode.SYNTHESIS_FAILED, "made to fail by the test")
    return job


def cancel(org: Any, webhook_url: str = "") -> Any:
    from webapp.speech import lifecycle

    job = _submit(org, "Cancel me.", webhook_url)
    lifecycle.cancel_job(job)
    return job


def _processing_voice(org: Any, name: str) -> Any:
    from webapp.speech.models import Voice

    return Voice.objects.create(
        voice_id=f"{org.slug}-{name}",
        organization=org,
        name=name,
        engine="piper",
        sample_rate=22050,
        status=Voice.Status.PROCESSING,
    )


def voice_ready(org: Any) -> Any:
    from webapp.speech.models import Voice
    from webapp.speech.services import prompts

    voice = _processing_voice(org, "ready")
    builtin = Voice.objects.get(voice_id=ESPEAK)
    profile = SimpleNamespace(embedding=[0.0], median_f0=120.0, f0_low=90.0, f0_high=150.0)
    closest = SimpleNamespace(voice_id=ESPEAK, similarity=0.5, pitch_shift=0.0)
    assert prompts.finish_analysis(voice.pk, profile, closest, builtin)
    return voice


def voice_rejected(org: Any) -> Any:
    from webapp.speech.services import prompts

    voice = _processing_voice(org, "rejected")
    assert prompts.reject_voice(voice.pk, "no_voice", "no voice heard in the prompt")
    return voice


def every_event(org: Any) -> set[tuple[str, str]]:
    """Make each event once on a tenant whose plan allows 100 characters a month: (type, subject) of each.

    The completions charge 50, then 35 characters (85 %: usage.threshold 80), a failure and a cancel
    charge nothing, and a last completion 15 (100 %).
    """
    made = {("job.succeeded", str(succeed(org, "x" * 50).id))}
    made |= {("job.succeeded", str(succeed(org, "y" * 35).id)), ("usage.threshold", "80")}
    made |= {("job.failed", str(fail(org).id)), ("job.canceled", str(cancel(org).id))}
    made |= {("job.succeeded", str(succeed(org, "z" * 15).id)), ("usage.threshold", "100")}
    made |= {("voice.ready", voice_ready(org).voice_id), ("voice.rejected", voice_rejected(org).voice_id)}
    return made
