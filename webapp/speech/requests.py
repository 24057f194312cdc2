"""What a request to speak says, checked: one serializer for the API's ``POST /api/v1/speech`` and
the dashboard's form, below both.

Validation is strict: unknown fields are refused, numbers must be JSON numbers (``"1.5"`` and
``true`` are not speeds), strings must be strings. What a voice can do comes from its
``capabilities``, so a request the engine cannot honour is a 400 naming the field
(``submission.job_request``).
"""

from __future__ import annotations

from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from synth.registry import SEED_RANGE
from webapp import outbound
from webapp.api_fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictNumberField,
    StrictSerializer,
)
from webapp.speech import submission
from webapp.speech.submission import FORMATS, LANES, LOUDNESS_RANGE, MAX_INSTRUCTIONS, VOICE_FALLBACKS


class SpeechTextField(StrictCharField):
    """The text to speak: NUL and lone surrogates are left to synth.text.validate_text,
    which names the character position (DRF's own validators would not)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [
            v
            for v in self.validators
            if not isinstance(v, ProhibitNullCharactersValidator | ProhibitSurrogateCharactersValidator)
        ]


SEED_HELP = (
    f"{SEED_RANGE[0]} - {SEED_RANGE[1]}: the same seed with the same text, voice and controls gives the "
    "same audio, on a model whose capabilities say seed: true (GET /v1/models); a 400 unsupported_control "
    "for one that does not take a seed. Left out: a fresh draw each time."
)
CACHE_HELP = (
    "Default true: sentences this tenant had rendered before with the same voice and controls are "
    "served from its sentence cache (billed at the plan's cached_character_price) and new ones are "
    "kept; false renders every sentence afresh and keeps none."
)

VOICE_FALLBACK_HELP = (
    "For an uploaded zero_shot voice that cannot be cloned now (no consent, its consent revoked, or the "
    'named model cannot clone). "none" (default): 422 cloning_unavailable, its reason naming why. '
    '"closest": the closest built-in voice its analysis measured speaks instead (the job is approximate), '
    "where there is one."
)


class DictionaryRefSerializer(StrictSerializer):
    id = StrictCharField(max_length=36, help_text="A dictionary id from GET /api/v1/dictionaries.")
    version = StrictIntegerField(
        required=False, min_value=1, help_text="The version to pin; its latest at submit when left out."
    )


class SpeechRequestSerializer(StrictSerializer):
    text = SpeechTextField(
        trim_whitespace=False, allow_blank=True, help_text="Text to speak (annotations allowed)."
    )
    voice = StrictCharField(required=False, max_length=200, help_text="Voice id from GET /api/v1/voices.")
    engine = StrictCharField(
        required=False,
        max_length=100,
        help_text="The model (engine) that speaks, from GET /v1/models; default: the voice's own. "
        "A name not found as given is tried as that engine's voice (engine:voice); an uploaded "
        "zero_shot voice speaks through any engine that clones.",
    )
    format = serializers.ChoiceField(choices=FORMATS, required=False, help_text="Audio format (default wav).")
    sample_rate = StrictIntegerField(required=False, min_value=1, max_value=384_000)
    speed = StrictNumberField(required=False, help_text="0.25 - 4.0")
    pitch = StrictNumberField(required=False, help_text="semitones, -12 - +12")
    volume = StrictNumberField(required=False, help_text="dB, -20 - +6")
    language = StrictCharField(required=False, max_length=35)
    instructions = StrictCharField(required=False, max_length=MAX_INSTRUCTIONS, allow_blank=True)
    loudness = StrictNumberField(
        required=False,
        min_value=LOUDNESS_RANGE[0],
        max_value=LOUDNESS_RANGE[1],
        help_text="Target integrated loudness in LUFS, -40 - -5 (e.g. -16 podcast, -23 broadcast).",
    )
    seed = StrictIntegerField(
        required=False, min_value=SEED_RANGE[0], max_value=SEED_RANGE[1], help_text=SEED_HELP
    )
    pronunciation_dictionaries = serializers.ListField(
        child=DictionaryRefSerializer(),
        required=False,
        max_length=3,
        help_text="At most 3 dictionaries (the first naming a word wins), pinned at submit; "
        "left out: the tenant's default dictionary; []: none.",
    )
    cache = StrictBooleanField(required=False, default=True, help_text=CACHE_HELP)
    voice_fallback = serializers.ChoiceField(
        choices=VOICE_FALLBACKS, required=False, default="none", help_text=VOICE_FALLBACK_HELP
    )
    lane = serializers.ChoiceField(
        choices=LANES,
        required=False,
        default="batch",
        help_text='"batch" (default): claimed after interactive work of the same model; "interactive": '
        "a client waits on this job's audio now (as every /v1/audio/speech request and realtime "
        "session does), so workers take it before batch work (docs/api.md, Lanes).",
    )
    webhook_url = StrictCharField(
        required=False,
        max_length=2000,
        help_text="An https URL this job's job.succeeded/failed/canceled events are sent to as well "
        "(signed with the tenant's job webhook secret; docs/api.md, Webhooks).",
    )

    def validate_webhook_url(self, value: str) -> str:
        try:
            outbound.check_literal(value)
        except outbound.Refused as exc:
            raise serializers.ValidationError(f"Not a webhook URL: {exc}.") from None
        return value

    def validate_format(self, value: Any) -> str:
        if not isinstance(value, str):
            raise serializers.ValidationError("Must be a string.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The fields against the voice and the text rules: ``attrs["job"]`` is the request to submit.

        The serializer's context names the tenant (``organization``) and where the
        request came from (``source``); the dashboard's form uses this serializer too.
        """
        organization = self.context["organization"]
        attrs["job"] = submission.job_request(
            organization,
            attrs,
            self.context.get("source", "api"),
            word_timestamps=bool(self.context.get("word_timestamps")),
        )
        return attrs
