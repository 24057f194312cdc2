"""What a voice's API object adds for an uploaded voice (mode, closest voice, pitch, embedding, consent)."""

from __future__ import annotations

from typing import Any

from webapp.speech.models import Voice
from webapp.speech.services import prompts


def uploaded_voice_fields(voice: Voice) -> dict[str, Any]:
    """The fields of an uploaded voice's API object (empty for built-in voices)."""
    if voice.organization_id is None:
        return {}
    ready = voice.status == Voice.Status.READY
    return {
        "cloning_mode": voice.cloning_mode,
        # Never called cloning: approximate speaks with the closest built-in voice.
        "speaks_with": (
            {
                "voice": voice.closest_voice,
                "pitch_shift": voice.pitch_shift,
                "similarity": voice.closest_similarity,
            }
            if ready and voice.cloning_mode == prompts.APPROXIMATE
            else None
        ),
        "pitch": {
            "median_hz": voice.pitch_median_hz,
            "low_hz": voice.pitch_low_hz,
            "high_hz": voice.pitch_high_hz,
        }
        if ready
        else None,
        "embedding": voice.embedding if ready else None,
        "transcript": voice.transcript,
        "consent": {
            "by": voice.consent_by_label,
            "at": voice.consent_at.isoformat() if voice.consent_at else None,
        },
        "rejected_code": voice.rejected_code or None,
        "status_reason": voice.status_reason,
    }
