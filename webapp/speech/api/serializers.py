"""Response shapes of the public API, and the OpenAI endpoint's request.

A request to speak is checked in ``webapp/speech/requests.py`` (the API's and the dashboard's
form alike). Validation is strict: unknown fields are refused, numbers must be JSON numbers
(``"1.5"`` and ``true`` are not speeds), strings must be strings.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from synth.registry import RATES_BY_FORMAT, SEED_RANGE
from webapp.api_fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictNumberField,
    iso,
)
from webapp.speech.api.voice_fields import uploaded_voice_fields
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.requests import CACHE_HELP, SEED_HELP, VOICE_FALLBACK_HELP, SpeechTextField
from webapp.speech.services.jobview import JobView
from webapp.speech.submission import VOICE_FALLBACKS

# --------------------------------------------------------------------- responses


class JobMetricsSerializer(serializers.Serializer):
    queue_ms = serializers.IntegerField(allow_null=True)
    synth_ms = serializers.IntegerField(allow_null=True)
    rtf = serializers.FloatField(allow_null=True)
    peak_rss_mb = serializers.FloatField(allow_null=True)
    peak_gpu_mb = serializers.FloatField(allow_null=True)
    engine = serializers.CharField(allow_null=True)
    device = serializers.CharField(allow_null=True)
    worker = serializers.CharField(allow_null=True)


class JobErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class JobSerializer(serializers.Serializer):
    """A synthesis job as clients see it (fields of docs/api.md, nothing internal)."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=SynthesisJob.Status.choices)
    text_chars = serializers.IntegerField()
    voice = serializers.CharField()
    format = serializers.CharField()
    lane = serializers.ChoiceField(
        choices=SynthesisJob.Lane.choices, help_text="interactive work is claimed before batch work"
    )
    progress = serializers.FloatField()
    queue_position = serializers.IntegerField(allow_null=True)
    eta_seconds = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    audio_url = serializers.URLField(allow_null=True)
    duration_seconds = serializers.FloatField(allow_null=True)
    pronunciation_dictionaries = serializers.ListField(
        child=serializers.DictField(),
        help_text="The versions pinned at submit: id, version, name, and once the job ran rules_applied "
        "and replacements (rules that could not be applied are in not_applied of the report).",
    )
    cached_characters = serializers.IntegerField(
        help_text="Of text_chars, those served from the sentence cache (set when the job succeeds)."
    )
    metrics = JobMetricsSerializer()
    error = JobErrorSerializer(allow_null=True)

    def to_representation(self, instance: Any) -> dict[str, Any]:
        request = self.context.get("request")
        return JobView(instance).for_api(request.build_absolute_uri if request is not None else None)


class JobPageSerializer(serializers.Serializer):
    results = JobSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class VoiceSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    engine = serializers.CharField()
    language = serializers.CharField()
    sample_rate = serializers.IntegerField()
    builtin = serializers.BooleanField()
    status = serializers.CharField()
    capabilities = serializers.DictField()
    created_at = serializers.DateTimeField()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        voice: Voice = instance
        return {
            "id": voice.voice_id,
            "name": voice.name,
            "engine": voice.engine,
            "language": voice.language,
            "sample_rate": voice.sample_rate,
            "builtin": voice.organization_id is None,
            "status": voice.status,
            "capabilities": {k: v for k, v in (voice.capabilities or {}).items() if k != "aliases"},
            # Other ids that name this voice (synth.registry: the namespaced form of a historic id).
            "aliases": list((voice.capabilities or {}).get("aliases") or []),
            "created_at": iso(voice.created_at),
            # The view says whether the caller may see embeddings (voice_fields.may_see_embeddings).
            **uploaded_voice_fields(voice, with_embedding=bool(self.context.get("with_embedding"))),
        }


class UsageSerializer(serializers.Serializer):
    plan = serializers.DictField()
    period = serializers.DictField()
    characters = serializers.DictField(child=serializers.IntegerField())
    jobs = serializers.DictField(child=serializers.IntegerField())
    storage = serializers.DictField(child=serializers.IntegerField())
    sentence_cache = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="cached_characters and fresh_characters of the jobs that succeeded this period; "
        "used_bytes and limit_bytes of the tenant's sentence cache.",
    )
    daily = serializers.ListField(child=serializers.DictField())


# OpenAI's response_format -> (our format, its rate when the body names none). OpenAI defines opus
# as Ogg/Opus and pcm as headerless 24 kHz 16-bit little-endian. ulaw and alaw are ours (8 kHz
# G.711, as ElevenLabs' ulaw_8000 and Twilio's media streams): OpenAI's clients pass the value on.
OPENAI_FORMATS: dict[str, tuple[str, int | None]] = {
    "mp3": ("mp3", None),
    "opus": ("ogg", 24000),
    "aac": ("aac", None),
    "flac": ("flac", None),
    "wav": ("wav", None),
    "pcm": ("pcm", 24000),
    "ulaw": ("ulaw", None),
    "alaw": ("alaw", None),
}
SAMPLE_RATE_HELP = (
    "Ours, not OpenAI's: the output rate in Hz. pcm and wav: "
    + ", ".join(map(str, RATES_BY_FORMAT["pcm"]))
    + " (default: pcm 24000, wav the voice's own); opus: "
    + ", ".join(map(str, RATES_BY_FORMAT["ogg"]))
    + " (default 24000); mp3, aac and flac as pcm (default the voice's own); ulaw and alaw: 8000 only. "
    "A voice may offer fewer (GET /api/v1/voices, capabilities.sample_rates_by_format)."
)


# vLLM-Omni's speech request fields this service does not serve, and why: each is refused with a
# 400 naming it when it asks for something (a null, a false, an empty value asks for nothing).
# Silently dropped, they would change the audio the client gets and still be charged in full.
VLLM_OMNI_REFUSED = {
    "ref_audio_2": "two-speaker dialogue is not served",
    "ambient_sound": "sound effects are not served",
    "duration_seconds": "a target duration is not served",
    "x_vector_only_mode": "no model here clones from a speaker embedding alone",
    "speaker_embedding": "no model here takes a speaker embedding",
    "max_new_tokens": "a generation token limit is not served (the plan's limits bound every request)",
    "initial_codec_chunk_frames": "no model here streams codec chunks; audio streams per sentence",
    "non_streaming_mode": "no model here has Qwen3-TTS's prompt modes",
    "extra_params": "model-specific parameters are not passed through",
    "word_timestamps": 'word timestamps come as events of stream_format "sse" with "timestamps": true, '
    "or from GET /api/v1/speech/{id}/timestamps",
}
TASK_TYPES = ("CustomVoice", "VoiceDesign", "Base")
# data:[<media type>][;parameters];base64,<data>
DATA_URL = re.compile(r"data:[\w.+-]*/?[\w.+-]*(;[\w.+-]+=[\w.+-]+)*;base64,", re.ASCII)


class OpenAISpeechSerializer(serializers.Serializer):
    """OpenAI's body, with vLLM-Omni's fields: each honoured or refused by name (VLLM_OMNI_REFUSED).
    Other unknown fields are ignored (OpenAI's newer clients send more)."""

    model = StrictCharField(
        required=False,
        allow_null=True,
        max_length=100,
        help_text="tts-1, tts-1-hd and gpt-4o-mini-tts (or none): the voice's own model; any other id of "
        "GET /v1/models names the model (engine) that speaks.",
    )
    input = SpeechTextField(trim_whitespace=False, allow_blank=True, max_length=4096)
    voice = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text='An OpenAI voice name (alloy, echo, ...) or one of our voice ids; {"id": ...} too.',
    )
    speaker = StrictCharField(
        required=False, allow_null=True, max_length=200, help_text="vLLM-Omni's other name for voice."
    )
    stream = StrictBooleanField(
        required=False,
        default=False,
        help_text='vLLM-Omni\'s streaming switch: true streams as stream_format says, "sse" when it says nothing.',
    )
    task_type = serializers.ChoiceField(
        choices=TASK_TYPES,
        required=False,
        allow_null=True,
        help_text='vLLM-Omni\'s: "CustomVoice" (a preset voice) and "Base" (a cloned voice) are what the voice '
        'is already; "VoiceDesign" is refused.',
    )
    language = StrictCharField(
        required=False,
        allow_null=True,
        max_length=35,
        help_text='A language tag the voice speaks (en-us, cmn); "Auto" or null: the voice\'s own.',
    )
    response_format = serializers.ChoiceField(
        choices=tuple(OPENAI_FORMATS),
        required=False,
        default="mp3",
        help_text="OpenAI's formats, and ulaw / alaw: raw 8 kHz G.711 (audio/basic, audio/x-alaw-basic) "
        "for telephony.",
    )
    sample_rate = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=384_000, help_text=SAMPLE_RATE_HELP
    )
    speed = StrictNumberField(required=False, allow_null=True, min_value=0.25, max_value=4.0)
    instructions = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=4096)
    seed = StrictIntegerField(
        required=False, allow_null=True, min_value=SEED_RANGE[0], max_value=SEED_RANGE[1], help_text=SEED_HELP
    )
    cache = StrictBooleanField(required=False, default=True, help_text=CACHE_HELP)
    voice_fallback = serializers.ChoiceField(
        choices=VOICE_FALLBACKS, required=False, default="none", help_text=VOICE_FALLBACK_HELP
    )
    stream_format = serializers.ChoiceField(
        choices=("audio", "sse"),
        required=False,
        allow_null=True,
        help_text='"audio": chunked audio as the sentences finish; "sse": the same as server-sent events '
        "(text/event-stream), a speech.audio.delta event (base64 audio) per chunk, then speech.audio.done "
        "with usage (input_tokens = total_tokens = the billable characters charged).",
    )
    ref_audio = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        trim_whitespace=False,
        help_text="vLLM-Omni's reference audio to clone for this request only, as a data: URL "
        "(data:audio/wav;base64,...); file: and http(s) URLs are refused. Needs a model that clones and "
        "consent (a recorded consent of the speaker, cons_...); kept only until the job ends.",
    )
    ref_text = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=2000,
        help_text="What ref_audio says (improves cloning); only with ref_audio.",
    )
    consent = StrictCharField(
        required=False,
        allow_null=True,
        max_length=100,
        help_text="Ours: the recorded consent (cons_...) of ref_audio's speaker (POST /v1/audio/voice_consents).",
    )
    timestamps = StrictBooleanField(
        required=False,
        default=False,
        help_text='With stream_format "sse" only: after each sentence\'s audio a speech.timestamps event '
        '({"type", "sentence": {index, text, start, end, char_start, char_end}, "words": [{text, start, end, '
        "char_start, char_end}]}; seconds from the audio's start, offsets into input as sent).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        raw = self.initial_data if isinstance(self.initial_data, dict) else {}
        for name, why in VLLM_OMNI_REFUSED.items():
            if raw.get(name) not in (None, False, "", [], {}):
                raise serializers.ValidationError({name: f"{name}: {why}."})
        ref_audio = attrs.get("ref_audio") or ""
        if ref_audio and not DATA_URL.match(ref_audio[:200]):
            raise serializers.ValidationError(
                {
                    "ref_audio": "ref_audio must be a data: URL with base64 audio (data:audio/wav;base64,...); "
                    "file: and http(s) URLs are not fetched."
                }
            )
        if attrs.get("ref_text") and not ref_audio:
            raise serializers.ValidationError(
                {"ref_text": "ref_text says what ref_audio says: send ref_audio too."}
            )
        if attrs.get("voice") in (None, "") and not attrs.get("speaker") and not ref_audio:
            raise serializers.ValidationError({"voice": "This field is required."})
        if attrs.get("voice") in (None, ""):
            attrs["voice"] = attrs.get("speaker")  # vLLM-Omni's alias, used only without a voice
        if attrs.get("task_type") == "VoiceDesign":
            raise serializers.ValidationError(
                {"task_type": "VoiceDesign is not served: name a preset or uploaded voice."}
            )
        if attrs.get("stream") and attrs.get("stream_format") is None:
            attrs["stream_format"] = "sse"  # vLLM-Omni: stream=true without a stream_format is SSE
        if str(attrs.get("language") or "").lower() == "auto":
            attrs["language"] = None
        if attrs.get("timestamps") and attrs.get("stream_format") != "sse":
            raise serializers.ValidationError(
                {"timestamps": 'timestamps are events of stream_format "sse"; ask for that stream.'}
            )
        return attrs
