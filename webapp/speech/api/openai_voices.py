"""``/v1/audio/voices``: the voices as OpenAI's and vLLM-Omni's clients list, upload and delete them.

``GET`` lists the tenant's voices three ways at once: ``data`` (ours: each voice with the OpenAI
names ``TTS_OPENAI_VOICE_MAP`` maps to it), and vLLM-Omni's ``voices`` (every name usable as
``voice``) and ``uploaded_voices`` (the tenant's own, in vLLM-Omni's entry shape).

``POST`` is vLLM-Omni's upload (multipart ``audio_sample``, ``consent``, ``name``, ``ref_text``,
``speaker_description``) on our upload path: the tenant's upload limits and rate, the decode
sandbox, the consent rules (``consent`` names a recorded consent, ``cons_...``, for a cloned voice).
As on vLLM-Omni a name is the tenant's once (case aside: 409 ``voice_name_taken``) and names the
voice on ``/v1/audio/speech``. vLLM-Omni's upload is ready when it answers; ours is analysed by a
worker, so the request waits up to ``TTS_OPENAI_VOICE_READY_SECONDS`` for the analysis and answers
``{"success": true, "voice": {...}}`` with the voice ``ready`` (or still ``processing``, said in
its ``status``); a prompt the analysis rejects is the same 4xx as on our own upload.

``DELETE /v1/audio/voices/{name}`` deletes the tenant's voice of that name (or id), with its prompt.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import DomainError, ErrorCode
from webapp.speech.api.serializers import VLLM_OMNI_REFUSED
from webapp.speech.api.views import TenantAPIView
from webapp.speech.api.voices import UploadForm, upload_voice
from webapp.speech.models import Voice
from webapp.speech.services import prompts
from webapp.speech.services.queries import visible_voices
from webapp.speech.voices import delete_voice
from webapp.tenants.models import Organization

# vLLM-Omni's field names for the upload's parts.
VLLM_OMNI_UPLOAD = UploadForm(
    audio="audio_sample", transcript="ref_text", description="speaker_description", unique_name=True
)
# A voice's name is the tenant's once among these (a rejected upload leaves its name free).
_NAMED = (Voice.Status.PROCESSING, Voice.Status.READY)


def openai_names() -> dict[str, list[str]]:
    """Our voice id -> the OpenAI names mapped to it."""
    names: dict[str, list[str]] = {}
    for name, voice in sorted(settings.TTS_OPENAI_VOICE_MAP.items()):
        names.setdefault(str(voice), []).append(str(name))
    return names


def uploaded_entry(voice: Voice) -> dict[str, Any]:
    """vLLM-Omni's entry for an uploaded voice, and ours beside it (``id``, ``status``)."""
    entry: dict[str, Any] = {
        "name": voice.name,
        "consent": f"cons_{voice.consent_id.hex}" if voice.consent_id else "",
        "created_at": int(voice.created_at.timestamp()),
        "file_size": voice.prompt_bytes,  # the stored prompt's (16-bit WAV), not the upload's
        "mime_type": "audio/wav",
        "embedding_source": "audio",
        "embedding_dim": None,
        "id": voice.voice_id,
        "status": voice.status,
    }
    if voice.transcript:
        entry["ref_text"] = voice.transcript
    if voice.description:
        entry["speaker_description"] = voice.description
    return entry


def own_voices_named(organization: Organization, name: str) -> Any:
    return Voice.objects.filter(
        organization=organization, name__iexact=name, status__in=_NAMED, one_off=False
    )


class OpenAIVoicesView(TenantAPIView):
    required_scopes = {"GET": "speech:read", "POST": "voices:write"}
    parser_classes = [MultiPartParser]

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        summary="Voices: ours with their OpenAI names, and vLLM-Omni's voices and uploaded_voices",
    )
    def get(self, request: Request) -> Response:
        names = openai_names()
        voices = list(visible_voices(self.organization).order_by("voice_id"))
        data: list[dict[str, Any]] = [
            {
                "id": v.voice_id,
                "object": "voice",
                "name": v.name,
                "language": v.language,
                "engine": v.engine,
                "openai_names": names.get(v.voice_id, []),
            }
            for v in voices
        ]
        usable = {v.voice_id for v in voices if v.organization_id is None}
        usable |= {v.name for v in voices if v.organization_id is not None}
        usable |= {n for v in voices for n in names.get(v.voice_id, [])}
        uploaded = Voice.objects.filter(
            organization=self.organization, status__in=_NAMED, one_off=False
        ).order_by("created_at")
        return Response(
            {
                "object": "list",
                "data": data,
                "openai_voice_map": dict(settings.TTS_OPENAI_VOICE_MAP),
                "voices": sorted(usable),
                "uploaded_voices": [uploaded_entry(v) for v in uploaded],
            }
        )

    @extend_schema(
        request={"multipart/form-data": {"type": "object"}},
        responses={200: OpenApiTypes.OBJECT},
        summary="Upload a voice as vLLM-Omni does (audio_sample, consent, name, ref_text, speaker_description)",
    )
    def post(self, request: Request) -> Response:
        voice = upload_voice(request, self.organization, VLLM_OMNI_UPLOAD, check=self._refusals)
        voice = prompts.decided(voice, settings.TTS_OPENAI_VOICE_READY_SECONDS)
        if voice.status == Voice.Status.REJECTED:
            raise DomainError(
                prompts.rejection_error(voice.rejected_code),
                voice.status_reason,
                field=VLLM_OMNI_UPLOAD.audio,
            )
        return Response({"success": True, "voice": uploaded_entry(voice)})

    def _refusals(self, request: Request) -> None:
        """What vLLM-Omni's upload allows and ours does not: a speaker embedding, a name taken."""
        if request.POST.get("speaker_embedding") not in (None, ""):
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"speaker_embedding: {VLLM_OMNI_REFUSED['speaker_embedding']}; upload audio_sample.",
                field="speaker_embedding",
            )
        name = str(request.POST.get("name") or "").strip()
        if name:  # before the decode (the insert checks again, under the tenant's lock)
            prompts.check_name_free(self.organization, name)


class OpenAIVoiceDetailView(TenantAPIView):
    required_scopes = {"DELETE": "voices:write"}

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="Delete an uploaded voice by name (or id)")
    def delete(self, request: Request, name: str) -> Response:
        own = Voice.objects.filter(organization=self.organization).exclude(status=Voice.Status.DELETED)
        matches = list(own.filter(voice_id=name)) or list(own_voices_named(self.organization, name)[:2])
        if not matches:
            raise DomainError(ErrorCode.NOT_FOUND, f"Voice '{name[:200]}' not found")
        if len(matches) > 1:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"Several voices are named '{name}'; delete one by its id (GET /v1/audio/voices).",
            )
        delete_voice(self.organization, matches[0])
        return Response({"success": True, "message": f"Voice '{name}' deleted successfully"})
