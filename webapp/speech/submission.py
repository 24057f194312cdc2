"""One way in for a synthesis request: validated once, then submitted through the lifecycle.

The REST API (``POST /api/v1/speech``), the OpenAI endpoint (``/v1/audio/speech``)
and the dashboard's form all come here. Their serializer parses the fields
(types, unknown fields); :func:`job_request` checks them against the voice's
capabilities and the text rules; :func:`submit` replays an idempotent retry,
checks that a worker serves the voice, and creates the job
(``lifecycle.submit_job``). What a voice can do comes from its
``capabilities`` (declared by the engine), so a request the engine cannot
honour is a 400 naming the field, never audio that silently ignores it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db.models import Case, Count, Q, When
from redis.exceptions import RedisError

from synth.errors import AnnotationError, InvalidText
from synth.registry import FORMATS
from synth.text import billable_characters, validate_text
from webapp.dictionaries import services as dictionaries
from webapp.errors import DomainError, ErrorCode
from webapp.speech import heartbeat, lifecycle
from webapp.speech.lifecycle import JobRequest
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.services import dispatch, lanes, prompts
from webapp.speech.services.eta import serving_children
from webapp.speech.services.pins import DictionaryPins, dictionary_pins
from webapp.speech.services.queries import visible_voice, visible_voices
from webapp.tenants.models import ApiKey, Organization

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
# voice_fallback: what a zero_shot voice that cannot be cloned now does (docs/voices.md, "When a
# voice cannot be cloned"). "none" (the default): 422 cloning_unavailable naming why; "closest": it
# speaks through the closest built-in voice its analysis measured (approximate, never called cloning).
VOICE_FALLBACKS = ("none", "closest")
LANES = ("batch", "interactive")  # SynthesisJob.Lane's values, the request field's choices


def _bad(code: str, field: str, detail: str, **extra: Any) -> DomainError:
    return DomainError(ErrorCode(code), detail, field=field, extra=extra or None)


def _find_voice(organization: Organization, voice_id: str) -> Voice | None:
    """The voice by its id, else by an alias (``piper:en_US-joe-medium`` for ``en_US-joe-medium``)."""
    voice = visible_voice(organization, voice_id)
    if voice is None and ":" in voice_id:
        voice = visible_voices(organization).filter(capabilities__aliases__contains=[voice_id]).first()
    return voice


def _resolve_voice(organization: Organization, data: dict[str, Any]) -> tuple[Voice, Voice | None, bool]:
    """(the voice asked for, the built-in voice that speaks it when another, whether that one is the
    closest voice standing in for a clone the request allowed: ``voice_fallback: closest``).

    With ``engine`` (the OpenAI endpoint's ``model``) a name not found as given is tried as that
    engine's voice (``engine:name``: vLLM-Omni's clients name a model's voices bare), then through
    ``TTS_OPENAI_VOICE_MAP``. A voice of another engine is refused; an uploaded zero_shot voice
    speaks through any engine that clones.
    """
    voice_id = data.get("voice") or settings.TTS_DEFAULT_VOICE
    engine = data.get("engine")
    if engine:
        _check_model(engine)
    candidates = [voice_id]
    if engine:
        mapped = settings.TTS_OPENAI_VOICE_MAP.get(voice_id.lower())
        candidates += [f"{engine}:{voice_id}", *([str(mapped)] if mapped else [])]
    voice = next((v for c in candidates if (v := _find_voice(organization, c)) is not None), None)
    if voice is None:
        where = f"model {engine} has" if engine else "there is"
        raise _bad(
            "unknown_voice",
            "voice",
            f"{where.capitalize()} no voice {voice_id!r}; GET /api/v1/voices lists them.",
        )
    if voice.cloning_mode == prompts.ZERO_SHOT:
        try:
            _check_consent(voice)
            return voice, _cloning_voice(voice, engine), False
        except DomainError as refusal:
            if data.get("voice_fallback") != "closest":
                raise
            return voice, _closest_fallback(voice, engine, refusal), True
    if voice.organization_id is None and voice.capabilities.get("prompt_only"):
        raise _bad(
            "unknown_voice",
            "voice",
            f"Voice {voice.voice_id} stands for the uploaded voices model {voice.engine} clones, and "
            "speaks none of its own: name an uploaded zero_shot voice.",
        )
    if engine and prompts.speaking_voice(voice)[1] != engine:
        raise _bad(
            "unknown_voice",
            "voice",
            f"Voice {voice.voice_id} is a voice of model {voice.engine}, not {engine}; "
            "GET /api/v1/voices lists each model's voices.",
        )
    return voice, None, False


def _closest_fallback(voice: Voice, engine: str | None, refusal: DomainError) -> Voice:
    """``voice_fallback: closest``: the built-in voice that speaks a zero_shot voice that cannot be
    cloned now, the closest one its analysis measured (a voice analysed ``approximate`` before it
    named a consent has one). Else, or when it is not the named model's, the refusal stands, saying so.
    """
    speaker = None
    if voice.closest_voice:
        speaker = Voice.objects.filter(
            organization__isnull=True, status=Voice.Status.READY, voice_id=voice.closest_voice
        ).first()
    if speaker is not None and (not engine or speaker.engine == engine):
        return speaker
    if speaker is None:
        why = "no closest built-in voice was measured for it (it was analysed zero_shot)"
    else:
        why = f"its closest voice {speaker.voice_id} is a voice of model {speaker.engine}, not {engine}"
    raise DomainError(
        refusal.code,
        f"{refusal.message} The closest-voice fallback is not available: {why}.",
        field=refusal.field,
        extra={**refusal.extra, "fallback": "unavailable"},
    )


def _check_model(engine: str) -> None:
    """A model (an engine) some worker installed: its voices are listed, or a live worker names it."""
    if Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY, engine=engine).exists():
        return
    require_worker_for_engine(engine)  # a live worker that cannot load it: 503 engine_unavailable
    raise _bad(
        "unknown_model",
        "engine",
        f"There is no model {engine!r}; GET /v1/models lists the installed ones.",
    )


def _check_consent(voice: Voice) -> None:
    """A voice is cloned only under a recorded consent in force (docs/voices.md, "Consent")."""
    refusal = prompts.consent_refusal(voice)
    if refusal is None:
        return
    why = (
        "its consent was revoked"
        if refusal == "consent_revoked"
        else "it has no recorded consent (POST /v1/audio/voice_consents, then name it on the voice)"
    )
    raise DomainError(
        ErrorCode.CLONING_UNAVAILABLE,
        f"Voice {voice.voice_id} cannot be cloned: {why}.",
        field="voice",
        extra={"reason": refusal},
    )


def _cloning_voice(voice: Voice, engine: str | None) -> Voice:
    """The built-in voice a zero_shot voice speaks through: the named engine's, else one that clones.

    Not bound at analysis: any model that clones speaks it (issue 50). Voices analysed before kept
    the engine they were bound to, which stays their default.
    """
    cloning = Voice.objects.filter(
        organization__isnull=True, status=Voice.Status.READY, capabilities__cloning=True
    ).order_by("engine", "voice_id")
    if engine:
        cloning = cloning.filter(engine=engine)
    elif voice.engine:
        cloning = cloning.order_by(Case(When(engine=voice.engine, then=0), default=1), "engine", "voice_id")
    speaker = cloning.first()
    if speaker is None:
        raise DomainError(
            ErrorCode.CLONING_UNAVAILABLE,
            f"Model {engine} cannot clone a voice from a prompt; GET /v1/models says which models clone."
            if engine
            else "No installed model can clone a voice from a prompt right now.",
            field="engine" if engine else "voice",
            extra={"reason": "model_cannot_clone" if engine else "no_cloning_model"},
        )
    return speaker


def job_request(
    organization: Organization, data: dict[str, Any], source: str = "api", word_timestamps: bool = False
) -> JobRequest:
    """Check a request's fields (parsed by the API's serializer) against its voice and the text rules.

    ``word_timestamps``: the client asked for them as it submits (OpenAI's SSE ``timestamps``).
    """
    voice, speaker, fallback = _resolve_voice(organization, data)
    # What the model that speaks can do decides (a zero_shot voice's speaker's).
    caps: dict[str, Any] = (speaker or voice).capabilities or {}
    if word_timestamps and caps.get("timestamps") is False:
        raise _bad(
            "unsupported_control",
            "timestamps",
            f"Model {(speaker or voice).engine} gives no word timestamps; GET /v1/models says which do.",
        )
    text: str = data["text"]
    _check_text(text)
    fmt = _check_format(voice, caps, data.get("format") or DEFAULT_FORMAT)
    rate = _check_sample_rate(voice, caps, fmt, data.get("sample_rate"))
    params = _check_controls(voice, caps, data)
    language = data.get("language")
    if language is not None:
        params["language"] = _check_language(voice, caps, language)
    if data.get("instructions"):
        if caps.get("instructions") is False:
            raise _bad(
                "unsupported_control",
                "instructions",
                f"Voice {voice.voice_id} ({voice.engine}) takes no instructions.",
            )
        params["instructions"] = data["instructions"]
    if data.get("loudness") is not None:
        params["loudness"] = data["loudness"]
    if data.get("seed") is not None:
        params["seed"] = _check_seed(speaker or voice, caps, data["seed"])
    billable = billable_characters(text)
    # Named ones, else the tenant's default (also on /v1/audio/speech, which names none).
    pins = dictionary_pins(dictionaries.resolve(organization, data.get("pronunciation_dictionaries")))
    return JobRequest(
        text=text,
        voice=voice,
        speaker=speaker,
        closest_fallback=fallback,
        format=fmt,
        sample_rate=rate,
        params=params,
        billable_chars=billable,
        source=source,
        dictionaries=pins,
        synth_chars=_synth_chars(text, billable, pins, params.get("language") or voice.language or ""),
        # The OpenAI route answers a client that waits on the job (or its stream): it holds the
        # job's waiter lease, and its going away abandons the job.
        waited=source == "openai",
        # A client waiting on the audio is interactive; a native job only when it asks to be.
        lane="interactive" if source == "openai" else data.get("lane") or "batch",
        use_cache=data.get("cache") is not False,
        webhook_url=data.get("webhook_url") or "",
    )


def _synth_chars(text: str, billable: int, pins: DictionaryPins, language: str) -> int | None:
    """The characters the engine will be given once the pinned dictionaries rewrote the text (None:
    no dictionary), refused past the expansion limit: the charge and the quota count the submitted
    text, so what dictionaries add must stay a bounded share of it."""
    if not pins.versions:
        return None
    added = max(0, dictionaries.rewritten_chars(text, pins.record, language) - len(text))
    limit = dictionaries.expansion_limit(billable)
    if billable + added > limit:
        raise _bad(
            "request_too_large",
            "pronunciation_dictionaries",
            f"The pronunciation dictionaries make {billable:,} characters into {billable + added:,}; "
            f"at most {limit:,} (TTS_DICTIONARY_MAX_EXPANSION). Shorten the aliases or leave the "
            "dictionary out.",
        )
    return billable + added


def _check_text(text: str) -> None:
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
            allowed_sample_rates=list(rates),
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


def _check_seed(voice: Voice, caps: dict[str, Any], seed: int) -> int:
    """A seed only for a model that honours one (its ``seed`` capability): the same seed, the same audio."""
    if not caps.get("seed"):
        raise _bad(
            "unsupported_control",
            "seed",
            f"Model {voice.engine} does not take a seed (its audio is not decided by one); "
            "GET /v1/models says which models do.",
        )
    return seed


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


NO_WORKER_RETRY_AFTER = 30
QUEUE_UNAVAILABLE = "The job queue is unavailable; try again shortly."


ENGINE_UNAVAILABLE_RETRY_AFTER = 60


def require_worker_for_engine(engine: str, workers: list[dict[str, Any]] | None = None) -> None:
    """503 ``engine_unavailable`` when a live worker is meant to serve ``engine`` but cannot load it."""
    if workers is None:
        try:
            workers = heartbeat.live_workers()
        except (RedisError, OSError) as exc:
            raise DomainError(ErrorCode.SERVICE_UNAVAILABLE, QUEUE_UNAVAILABLE, retry_after=5) from exc
    if any(engine in (w.get("unavailable") or {}) for w in workers):
        raise DomainError(
            ErrorCode.ENGINE_UNAVAILABLE,
            f"The workers meant to serve model {engine} cannot load it right now; try again later.",
            retry_after=ENGINE_UNAVAILABLE_RETRY_AFTER,
        )


def require_worker_for(voice: Voice, speaker: Voice | None = None, closest_fallback: bool = False) -> None:
    """A submit for a voice no live worker serves is a 503, not a job that waits forever.

    Except on a queue whose pool may scale to zero (``TTS_SCALE_TO_ZERO_QUEUES``) while no
    worker of the engine is live: the job queues, and its backlog is what scales the pool up
    (KEDA, ``services/keda.py``). A live worker of the engine that lacks the voice is still a 503.
    """
    try:
        workers = heartbeat.live_workers()
    except (RedisError, OSError) as exc:
        raise DomainError(ErrorCode.SERVICE_UNAVAILABLE, QUEUE_UNAVAILABLE, retry_after=5) from exc
    # An uploaded voice speaks through a built-in one (a zero_shot voice: the one chosen at submit).
    speaking, engine = prompts.speaking_voice(voice, speaker, approximate=closest_fallback)[:2]
    if speaking in heartbeat.serving_voices(workers):
        return
    if dispatch.scales_to_zero(engine) and not serving_children(engine, workers):
        return
    require_worker_for_engine(engine, workers)
    raise DomainError(
        ErrorCode.NO_WORKER,
        f"No synthesis worker serving voice {speaking} is running right now; try again later.",
        retry_after=NO_WORKER_RETRY_AFTER,
    )


# ElevenLabs' names for an account's concurrency in use and allowed (agents' SDKs read them), and
# ours for the key's share of it.
CONCURRENCY_HEADERS = (
    "current-concurrent-requests",
    "maximum-concurrent-requests",
    "key-current-concurrent-requests",
)


def concurrency_headers(organization: Organization, api_key: ApiKey | None) -> dict[str, str]:
    """The tenant's active jobs (queued and running), its plan's cap on them, and the key's active jobs."""
    counts = SynthesisJob.objects.filter(
        organization_id=organization.pk, status__in=SynthesisJob.ACTIVE
    ).aggregate(tenant=Count("id"), key=Count("id", filter=Q(api_key_id=getattr(api_key, "pk", None))))
    headers = {
        CONCURRENCY_HEADERS[0]: str(counts["tenant"]),
        CONCURRENCY_HEADERS[1]: str(organization.plan.max_concurrent_jobs),
    }
    if api_key is not None:
        headers[CONCURRENCY_HEADERS[2]] = str(counts["key"])
    return headers


def engine_of(request: JobRequest) -> str:
    """The engine that will speak ``request`` (an uploaded voice speaks through a built-in one's)."""
    return prompts.speaking_voice(request.voice, request.speaker, approximate=request.closest_fallback)[1]


def submit(
    organization: Organization,
    request: JobRequest,
    *,
    body: Mapping[str, Any] | None = None,
    api_key: ApiKey | None = None,
    user: Any = None,
    idempotency_key: str | None = None,
    admit: bool = False,
) -> tuple[SynthesisJob, bool]:
    """Submit a checked request: (job, created). ``body``: what the client sent, for Idempotency-Key.

    A retry with the same Idempotency-Key gets its job back before anything else
    is checked (a retry must not fail because, say, no worker is up right now).
    ``admit``: the request streams interactive audio, refused while its lane is full
    (``services.lanes.admit``).
    """
    fingerprint = lifecycle.request_fingerprint(dict(body or {}))
    if idempotency_key is not None:
        replay = lifecycle.idempotent_replay(organization, idempotency_key, fingerprint)
        if replay is not None:
            return replay, False
    require_worker_for(request.voice, request.speaker, request.closest_fallback)
    if admit:
        # A new stream is refused at once while its lane is full (a session's units are not: the
        # session was admitted with its config or context).
        lanes.admit(engine_of(request))
    try:
        return lifecycle.submit_job(
            organization,
            request,
            api_key=api_key,
            user=user,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
        )
    except RedisError as exc:
        raise DomainError(ErrorCode.SERVICE_UNAVAILABLE, QUEUE_UNAVAILABLE, retry_after=5) from exc
