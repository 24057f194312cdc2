"""Request validation and response shapes of the public API.

Validation is strict: unknown fields are refused, numbers must be JSON
numbers (``"1.5"`` and ``true`` are not speeds), strings must be strings.
What a voice can do comes from its ``capabilities`` (declared by the engine),
so a request the engine cannot honour is a 400 naming the field, never
audio that silently ignores it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.conf import settings
from django.core.validators import ProhibitNullCharactersValidator
from django.urls import reverse
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from webapp.api_fields import StrictCharField, StrictIntegerField, StrictNumberField, StrictSerializer
from webapp.errors import DomainError, ErrorCode
from webapp.speech.api.voice_fields import uploaded_voice_fields
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.services.eta import estimate
from webapp.speech.services.jobs import JobRequest
from webapp.speech.services.queries import visible_voice
from webapp.tenants.models import Organization

FORMATS = ("wav", "flac", "ogg", "mp3", "pcm", "aac")
DEFAULT_FORMAT = "wav"
# Used when a voice declares no range of its own (docs/api.md).
CONTROL_RANGES: dict[str, tuple[float, float]] = {
    "speed": (0.25, 4.0),
    "pitch": (-12.0, 12.0),
    "volume": (-20.0, 6.0),
}
CONTROL_DEFAULTS = {"speed": 1.0, "pitch": 0.0, "volume": 0.0}
LANGUAGE_RE = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8}){0,3}$")
MAX_INSTRUCTIONS = 1000
# Target loudness the API offers (LUFS): quieter than -40 is inaudible in practice,
# louder than -5 clips; synth itself accepts a wider range.
LOUDNESS_RANGE = (-40.0, -5.0)


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


class SpeechRequestSerializer(StrictSerializer):
    text = SpeechTextField(
        trim_whitespace=False, allow_blank=True, help_text="Text to speak (annotations allowed)."
    )
    voice = StrictCharField(required=False, max_length=200, help_text="Voice id from GET /api/v1/voices.")
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

    def validate_format(self, value: Any) -> str:
        if not isinstance(value, str):
            raise serializers.ValidationError("Must be a string.")
        return value


def _bad(code: str, field: str, detail: str, **extra: Any) -> DomainError:
    return DomainError(ErrorCode(code), detail, field=field, extra=extra or None)


def build_job_request(organization: Organization, data: dict[str, Any], source: str = "api") -> JobRequest:
    """Check a validated request against its voice's capabilities and the text rules."""
    from synth.text import billable_characters

    voice_id = data.get("voice") or settings.TTS_DEFAULT_VOICE
    voice = visible_voice(organization, voice_id)
    if voice is None:
        raise _bad(
            "unknown_voice", "voice", f"There is no voice {voice_id!r}; GET /api/v1/voices lists them."
        )
    caps: dict[str, Any] = voice.capabilities or {}
    text: str = data["text"]
    _check_text(text)
    fmt = _check_format(voice, caps, data.get("format") or DEFAULT_FORMAT)
    rate = _check_sample_rate(voice, caps, fmt, data.get("sample_rate"))
    params = _check_controls(voice, caps, data)
    language = data.get("language")
    if language is not None:
        params["language"] = _check_language(voice, caps, language)
    if data.get("instructions"):
        params["instructions"] = data["instructions"]
    if data.get("loudness") is not None:
        params["loudness"] = data["loudness"]
    return JobRequest(
        text=text,
        voice=voice,
        format=fmt,
        sample_rate=rate,
        params=params,
        billable_chars=billable_characters(text),
        source=source,
    )


def _check_text(text: str) -> None:
    from synth.errors import AnnotationError, InvalidText
    from synth.text import validate_text

    try:
        validate_text(text)
    except AnnotationError as exc:
        raise _bad(exc.code, "text", f"text: {exc.message}.", position=exc.position) from exc
    except InvalidText as exc:
        position = re.search(r"position (\d+)", exc.message)
        extra = {"position": int(position.group(1))} if position else {}
        raise _bad(exc.code, "text", f"text: {exc.message}.", **extra) from exc


def _check_format(voice: Voice, caps: dict[str, Any], fmt: str) -> str:
    formats = caps.get("formats") or list(FORMATS)
    if fmt not in formats:
        raise _bad(
            "unsupported_format",
            "format",
            f"Voice {voice.voice_id} ({voice.engine}) cannot produce {fmt}; it supports {', '.join(formats)}.",
        )
    return fmt


def _check_sample_rate(voice: Voice, caps: dict[str, Any], fmt: str, rate: int | None) -> int | None:
    if rate is None:
        return None
    rates = (
        (caps.get("sample_rates_by_format") or {}).get(fmt) or caps.get("sample_rates") or [voice.sample_rate]
    )
    if rate not in rates:
        raise _bad(
            "unsupported_sample_rate",
            "sample_rate",
            f"{fmt} from voice {voice.voice_id} is available at {', '.join(str(r) for r in rates)} Hz, not {rate}.",
        )
    return rate


def _check_controls(voice: Voice, caps: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """speed, pitch, volume: within the voice's range, and only those the voice can change."""
    params: dict[str, Any] = {}
    controls = caps.get("controls")
    for name, (low_default, high_default) in CONTROL_RANGES.items():
        value = data.get(name)
        if value is None:
            continue
        low, high = caps.get(f"{name}_range") or (low_default, high_default)
        if not low <= value <= high:
            raise _bad("out_of_range", name, f"{name} must be between {low:g} and {high:g}; got {value:g}.")
        if controls is not None and name not in controls and value != CONTROL_DEFAULTS[name]:
            raise _bad(
                "unsupported_control", name, f"Voice {voice.voice_id} ({voice.engine}) cannot change {name}."
            )
        params[name] = value
    return params


def _check_language(voice: Voice, caps: dict[str, Any], language: str) -> str:
    if not LANGUAGE_RE.match(language):
        raise _bad(
            "invalid_language", "language", f"{language!r} is not a language tag like 'en-us' or 'cmn'."
        )
    known = [str(x).lower().replace("_", "-") for x in caps.get("languages") or [voice.language]]
    if not caps.get("language_switch") and language.lower().replace("_", "-") not in known:
        raise _bad(
            "unsupported_language",
            "language",
            f"Voice {voice.voice_id} speaks {', '.join(known)}; it cannot speak {language!r}.",
        )
    return language


# --------------------------------------------------------------------- responses

_dt = serializers.DateTimeField()


def _iso(value: Any) -> str | None:
    return None if value is None else str(_dt.to_representation(value))


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


METRIC_KEYS = ("queue_ms", "synth_ms", "rtf", "peak_rss_mb", "peak_gpu_mb", "engine", "device", "worker")


def public_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a tenant sees of a run: no host names or pids (they stay in the row, for logs and the admin).

    ``worker`` is an opaque label of the worker process, enough to tell runs apart.
    """
    public = {k: metrics.get(k) for k in METRIC_KEYS}
    if public["worker"]:
        public["worker"] = "w-" + hashlib.sha256(str(public["worker"]).encode()).hexdigest()[:12]
    return public


class JobSerializer(serializers.Serializer):
    """A synthesis job as clients see it (fields of docs/api.md, nothing internal)."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=SynthesisJob.Status.choices)
    text_chars = serializers.IntegerField()
    voice = serializers.CharField()
    format = serializers.CharField()
    progress = serializers.FloatField()
    queue_position = serializers.IntegerField(allow_null=True)
    eta_seconds = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    audio_url = serializers.URLField(allow_null=True)
    duration_seconds = serializers.FloatField(allow_null=True)
    metrics = JobMetricsSerializer()
    error = JobErrorSerializer(allow_null=True)

    def to_representation(self, instance: Any) -> dict[str, Any]:
        job: SynthesisJob = instance
        request = self.context.get("request")
        # The engine's basis (rolling mean, heartbeats) is read once a second per process.
        eta, position = estimate(job)
        audio_url = None
        if job.status == SynthesisJob.Status.SUCCEEDED and job.audio_path:
            path = reverse("api-speech-audio", args=[job.id])
            audio_url = request.build_absolute_uri(path) if request is not None else path
        return {
            "id": str(job.id),
            "status": job.status,
            "text_chars": job.text_chars,
            "voice": job.voice_name,
            "format": job.format,
            "progress": round(float(job.progress), 4),
            "queue_position": position,
            "eta_seconds": eta,
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "expires_at": _iso(job.expires_at),
            "audio_url": audio_url,
            "duration_seconds": job.duration_seconds,
            "metrics": public_metrics(job.metrics or {}),
            "error": {"code": job.error_code, "message": job.error_message} if job.error_code else None,
        }


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
            "capabilities": voice.capabilities or {},
            "created_at": _iso(voice.created_at),
            **uploaded_voice_fields(voice),
        }


class UsageSerializer(serializers.Serializer):
    plan = serializers.DictField()
    period = serializers.DictField()
    characters = serializers.DictField(child=serializers.IntegerField())
    jobs = serializers.DictField(child=serializers.IntegerField())
    storage = serializers.DictField(child=serializers.IntegerField())
    daily = serializers.ListField(child=serializers.DictField())


class OpenAISpeechSerializer(serializers.Serializer):
    """OpenAI's body: unknown fields are ignored (newer clients send more)."""

    model = StrictCharField(max_length=100)
    input = SpeechTextField(trim_whitespace=False, allow_blank=True, max_length=4096)
    voice = serializers.JSONField(
        help_text="An OpenAI voice name (alloy, echo, ...) or one of our voice ids."
    )
    response_format = serializers.ChoiceField(
        choices=("mp3", "opus", "aac", "flac", "wav", "pcm"), required=False, default="mp3"
    )
    speed = StrictNumberField(required=False, min_value=0.25, max_value=4.0)
    instructions = StrictCharField(required=False, allow_blank=True, max_length=4096)
    stream_format = serializers.ChoiceField(
        choices=("audio",), required=False, help_text='"audio": chunked audio as the sentences finish.'
    )
