"""What a voice's API object adds for an uploaded voice (mode, closest voice, pitch, embedding, consent)."""

from __future__ import annotations

from typing import Any

from webapp.speech.models import Voice
from webapp.speech.services import prompts
from webapp.tenants import roles
from webapp.tenants.models import ApiKey

VOICES_WRITE = ApiKey.Scope.VOICES_WRITE.value


def may_see_embeddings(request: Any) -> bool:
    """A speaker embedding is biometric data: only for a key that may manage voices.

    The key must carry ``voices:write`` and its role allow it (owners and admins):
    viewers and members, and read-only keys, see a voice without its embedding.
    """
    key = getattr(request, "auth", None)
    role = getattr(getattr(request, "user", None), "role", None)
    return (
        isinstance(key, ApiKey)
        and VOICES_WRITE in (key.scopes or [])
        and roles.role_allows(role, VOICES_WRITE)
    )


def uploaded_voice_fields(voice: Voice, with_embedding: bool = False) -> dict[str, Any]:
    """The fields of an uploaded voice's API object (empty for built-in voices).

    ``embedding`` is there only ``with_embedding`` (:func:`may_see_embeddings`).
    """
    if voice.organization_id is None:
        return {}
    ready = voice.status == Voice.Status.READY
    fields: dict[str, Any] = {
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
        "transcript": voice.transcript,
        "consent": {
            "by": voice.consent_by_label,
            "at": voice.consent_at.isoformat() if voice.consent_at else None,
            # The recorded consent cloning needs (cons_...), None for a voice confirmed by consent=true.
            "id": f"cons_{voice.consent_id.hex}" if voice.consent_id else None,
        },
        "rejected_code": voice.rejected_code or None,
        "status_reason": voice.status_reason,
    }
    if with_embedding:
        fields["embedding"] = voice.embedding if ready else None
    return fields
