"""``GET /v1/models``: what OpenAI's clients and tools list before speaking (the voices:
api/openai_voices.py).

The models are OpenAI's own names (``tts-1``, ``tts-1-hd``, ``gpt-4o-mini-tts``: the voice's
own model speaks) and every installed model (engine) with a ready voice, with what it can do
(synth.registry.CAPABILITY_DEFAULTS) and whether a live worker serves it now.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.speech import heartbeat
from webapp.speech.api.openai import OPENAI_MODELS
from webapp.speech.api.views import TenantAPIView
from webapp.speech.models import Voice

MODELS = OPENAI_MODELS
CREATED = 1_700_000_000  # a fixed timestamp: the field is required, its value means nothing here
# Per voice, not per model: left out of a model's capabilities (languages are merged instead).
VOICE_ONLY = ("aliases",)


def installed_models() -> dict[str, dict[str, Any]]:
    """Each engine with a ready built-in voice: its capabilities, its voices' languages merged."""
    models: dict[str, dict[str, Any]] = {}
    rows = Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY).order_by(
        "engine", "voice_id"
    )
    for engine, caps in rows.values_list("engine", "capabilities"):
        caps = dict(caps or {})
        model = models.setdefault(engine, {"capabilities": caps, "voices": 0, "languages": set()})
        model["voices"] += 1
        model["languages"].update(str(x) for x in caps.get("languages") or [])
    for model in models.values():
        model["capabilities"] = {
            **{k: v for k, v in model["capabilities"].items() if k not in VOICE_ONLY},
            "languages": sorted(model.pop("languages")),
        }
    return models


class OpenAIModelsView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT}, summary="Models: OpenAI's names and the installed engines"
    )
    def get(self, request: Request) -> Response:
        data: list[dict[str, Any]] = [
            {"id": m, "object": "model", "created": CREATED, "owned_by": "tts-service", "alias_of": "voice"}
            for m in MODELS
        ]
        try:
            workers = heartbeat.live_workers()
        except Exception:  # Redis away: the list still says what is installed
            workers = []
        serving = {
            str(e)
            for w in workers
            if w.get("state") in heartbeat.SERVING_STATES
            for e in w.get("engines") or []
        }
        unavailable = {str(e): str(why) for w in workers for e, why in (w.get("unavailable") or {}).items()}
        for engine, model in installed_models().items():
            entry: dict[str, Any] = {
                "id": engine,
                "object": "model",
                "created": CREATED,
                "owned_by": "tts-service",
                "engine": engine,
                "voices": model["voices"],
                "capabilities": model["capabilities"],
                "served": engine in serving,
            }
            if engine not in serving and engine in unavailable:
                entry["unavailable"] = True
            data.append(entry)
        return Response({"object": "list", "data": data})
