"""``GET /v1/models`` and ``GET /v1/audio/voices``: what OpenAI's clients and tools list before speaking.

Every model name runs the same engines (the voice picks the engine); the
models are listed so tools that check a model exists find one. The voices
are the tenant's (built-in and its own ready voices), each with the OpenAI
names that ``TTS_OPENAI_VOICE_MAP`` maps to it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.speech.api.views import TenantAPIView
from webapp.speech.services.queries import visible_voices

# The speech models OpenAI's clients name; all of them are served by the voice's own engine.
MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
CREATED = 1_700_000_000  # a fixed timestamp: the field is required, its value means nothing here


class OpenAIModelsView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="OpenAI-compatible model list")
    def get(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": CREATED, "owned_by": "tts-service"} for m in MODELS]
        return Response({"object": "list", "data": data})


def openai_names() -> dict[str, list[str]]:
    """Our voice id -> the OpenAI names mapped to it."""
    names: dict[str, list[str]] = {}
    for name, voice in sorted(settings.TTS_OPENAI_VOICE_MAP.items()):
        names.setdefault(str(voice), []).append(str(name))
    return names


class OpenAIVoicesView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="Voices and the OpenAI names mapped to them")
    def get(self, request: Request) -> Response:
        names = openai_names()
        data: list[dict[str, Any]] = [
            {
                "id": v.voice_id,
                "object": "voice",
                "name": v.name,
                "language": v.language,
                "engine": v.engine,
                "openai_names": names.get(v.voice_id, []),
            }
            for v in visible_voices(self.organization).order_by("voice_id")
        ]
        return Response(
            {"object": "list", "data": data, "openai_voice_map": dict(settings.TTS_OPENAI_VOICE_MAP)}
        )
