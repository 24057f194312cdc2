"""Uploaded voices: accept a prompt, analyse it, say which cloning mode it gets, forget it on delete.

The web tier only runs :func:`synth.prompt.prepare_prompt` (a limited child
process) and stores the canonical prompt; the analysis (speaker embedding,
pitch, closest voice) runs on the ``analysis`` queue (webapp/speech/runtime/analysis.py)
and ends here in :func:`finish_analysis` or :func:`reject_voice`. A prompt is
biometric data: rejecting or deleting a voice removes its files and embedding
at once (docs/voices.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files import File
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from synth.prompt import (
    PROMPT_MAX_SECONDS,
    PROMPT_MIN_SECONDS,
    UPLOAD_CODES,
    PromptLimits,
    PromptRejected,
    prepare_prompt,
    sandbox_mode,
)
from webapp.errors import DomainError, ErrorCode
from webapp.speech.models import Voice, VoiceConsent
from webapp.speech.services import decodes, dispatch, events, files
from webapp.tenants import locks
from webapp.tenants.models import Organization

if TYPE_CHECKING:
    from synth.engines.base import VoicePrompt

log = logging.getLogger(__name__)

ZERO_SHOT = "zero_shot"
APPROXIMATE = "approximate"
MODES = (ZERO_SHOT, APPROXIMATE)
# Voices that count against the plan's max_voices.
_LIVE = Q(status__in=[Voice.Status.PROCESSING, Voice.Status.READY])


@dataclass(frozen=True)
class VoiceUpload:
    name: str
    transcript: str
    cloning_mode: str | None  # None: the best mode the installed engines offer
    consent_by: Any  # the user, or None for a key without one
    consent_label: str  # who confirmed consent, in words that outlive the user row
    consent: VoiceConsent | None = None  # the recorded consent it names (zero_shot needs one)
    description: str = ""  # free words about the voice (vLLM-Omni's speaker_description)
    unique_name: bool = False  # the name is the tenant's once among its live voices (vLLM-Omni's upload)
    one_off: bool = False  # a request's own reference audio, gone with its job (Voice.one_off)


@functools.cache
def decode_sandbox() -> str:
    """What confines this process's decode children (``TTS_PROMPT_SANDBOX``), found once.

    gunicorn's workers call it as they start (deploy/gunicorn.conf.py), so the log says which
    mode runs and a mode the host cannot give stops the start instead of each upload.
    """
    mode = sandbox_mode(settings.TTS_PROMPT_SANDBOX)
    if mode == "limits":
        log.warning(
            "voice uploads decode under resource limits only: this host offers neither Landlock "
            "nor bubblewrap, so the decode child can read what the web user can (docs/voices.md)"
        )
    else:
        log.info("voice uploads decode in a sandbox: %s", mode)
    return mode


def cloning_modes() -> dict[str, bool]:
    """Which modes the installed engines offer: zero_shot needs a served voice with the cloning capability."""
    cloning = Voice.objects.filter(
        organization__isnull=True, status=Voice.Status.READY, capabilities__cloning=True
    ).exists()
    return {ZERO_SHOT: cloning, APPROXIMATE: True}


def _mode(requested: str | None, consented: bool) -> str:
    """The voice's mode: the one asked for, else zero_shot where a model clones and a consent is named."""
    available = cloning_modes()
    if requested is None:
        return ZERO_SHOT if available[ZERO_SHOT] and consented else APPROXIMATE
    if requested not in MODES:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            f"cloning_mode must be one of {', '.join(MODES)}.",
            field="cloning_mode",
        )
    if not available[requested]:
        raise DomainError(
            ErrorCode.CLONING_UNAVAILABLE,
            "No installed engine can clone a voice from a prompt (zero_shot); "
            "use cloning_mode=approximate, which picks the closest built-in voice.",
            field="cloning_mode",
        )
    return requested


def decode_limits(
    organization: Organization,
    min_seconds: float = PROMPT_MIN_SECONDS,
    max_seconds: float = PROMPT_MAX_SECONDS,
) -> PromptLimits:
    """What confines the decode child of one of the tenant's uploads (a prompt's lengths by default)."""
    return PromptLimits(
        max_bytes=upload_limit(organization),
        min_seconds=min_seconds,
        max_seconds=max_seconds,
        timeout_seconds=settings.TTS_PROMPT_DECODE_TIMEOUT_SECONDS,
        memory_mb=settings.TTS_PROMPT_DECODE_MEMORY_MB,
        sandbox=decode_sandbox(),
        # The admitted decodes yield the CPU to the web workers' requests: the children's
        # start-up was what slowed other tenants' reads (tests/e2e/test_upload_load.py).
        niceness=settings.TTS_PROMPT_DECODE_NICE,
    )


def upload_limit(organization: Organization) -> int:
    """Largest prompt file this tenant may upload: its plan's limit within the service's."""
    return min(int(organization.plan.max_upload_bytes), int(settings.TTS_MAX_UPLOAD_BYTES))


def _check_room(organization: Organization) -> None:
    plan = organization.plan
    if Voice.objects.filter(_LIVE, organization=organization, one_off=False).count() >= plan.max_voices:
        raise DomainError(
            ErrorCode.QUOTA_EXCEEDED,
            f"The plan allows {plan.max_voices} voices; delete one before adding another.",
            extra={"limit": "max_voices", "max_voices": plan.max_voices},
        )


def upload_error(code: str) -> ErrorCode:
    """The API error for a refusal of synth.prompt (HTTP statuses in webapp/problems.py).

    Its upload codes are API codes too, except the size limit, which the API calls
    ``request_too_large`` like any other body over a limit.
    """
    if code == "upload_too_large":
        return ErrorCode.REQUEST_TOO_LARGE
    return ErrorCode(code) if code in UPLOAD_CODES else ErrorCode.INVALID_AUDIO


def rejection_error(code: str) -> ErrorCode:
    """The API error for an analysis's rejection code: itself where it is one (``consent_mismatch``),
    else as an upload's refusal (``no_speech`` is an ``invalid_audio``)."""
    codes = {c.value for c in ErrorCode}
    return ErrorCode(code) if code in codes and code != "upload_too_large" else upload_error(code)


@dataclass(frozen=True)
class Admitted:
    """An upload counted against its tenant's upload rate (:func:`admit_upload`); create_voice needs one."""

    organization_id: Any


def admit_upload(organization: Organization) -> Admitted:
    """Count one upload against the tenant's upload rate (``429 rate_limited``), refused ones too: each
    may cost a decode. Callers count before they read the body, so a refusal costs little."""
    decodes.count_upload(organization.pk)
    return Admitted(organization.pk)


@contextlib.contextmanager
def spooled(upload: File) -> Iterator[str]:
    """A path to the uploaded file: Django's temporary file, or the file spooled to disk when it is
    still in memory (removed after the block)."""
    path = getattr(upload, "temporary_file_path", None)
    if callable(path):
        yield str(path())
        return
    folder = os.path.join(str(settings.MEDIA_ROOT), "tmp")
    os.makedirs(folder, exist_ok=True)
    fd, spooled_path = tempfile.mkstemp(prefix="upload-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in upload.chunks():
                fh.write(chunk)
        yield spooled_path
    finally:
        os.remove(spooled_path)


def create_voice_from_file(
    organization: Organization, audio: File, upload: VoiceUpload, admitted: Admitted
) -> Voice:
    """:func:`create_voice` for an uploaded file."""
    with spooled(audio) as path:
        return create_voice(organization, path, upload, admitted)


def create_voice(
    organization: Organization, upload_path: str, upload: VoiceUpload, admitted: Admitted
) -> Voice:
    """Check and convert the uploaded file, store the canonical prompt and queue its analysis.

    ``upload_path`` is a temporary file the caller removes. Cheap refusals
    (the upload rate, in :func:`admit_upload`; voice count, mode) come before the file is read; the decode
    waits for its slot (``429 too_many_uploads``, ``503 decoder_busy``).
    """
    if admitted.organization_id != organization.pk:
        raise ValueError("an upload admitted for another tenant")
    mode = _mode(upload.cloning_mode, upload.consent is not None)
    if upload.consent is None and organization.plan.voices_need_recorded_consent:
        raise DomainError(
            ErrorCode.CONSENT_REQUIRED,
            "This plan needs a recorded consent for every voice: record one (POST /v1/audio/voice_consents) "
            "and name it (consent=cons_...).",
            field="consent",
        )
    if upload.one_off and mode != ZERO_SHOT:
        raise DomainError(
            ErrorCode.CLONING_UNAVAILABLE,
            "Reference audio is cloned zero-shot, which needs a model that clones and a recorded consent "
            "(consent=cons_...).",
            field="ref_audio",
        )
    if mode == ZERO_SHOT and upload.consent is None:
        raise DomainError(
            ErrorCode.CONSENT_REQUIRED,
            "A voice cloned zero-shot needs a recorded consent: record one (POST /v1/audio/voice_consents) "
            "and name it (consent=cons_...).",
            field="consent",
        )
    if not upload.one_off:
        _check_room(organization)
    if not connection.in_atomic_block:
        # Back to the pool (ASGI) while the upload waits for a decoder and decodes: a connection
        # held that long by each upload would be taken from every other request of the process.
        connection.close()
    voice_uuid = uuid.uuid4()
    relative = f"voices/{organization.pk}/{voice_uuid.hex}.wav"
    target = files.media_path(relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    limits = decode_limits(organization)
    try:
        # Bounded per tenant and per host (services.decodes): a burst of uploads waits in one
        # queue or is refused, never a pile of decode children taking the web tier's CPU.
        with decodes.decode_slot(organization.pk):
            stats = prepare_prompt(upload_path, target, limits)
    except PromptRejected as exc:
        raise DomainError(upload_error(exc.code), exc.message, field="audio") from exc
    original = _keep_original(upload_path, organization, voice_uuid, stats.container)
    try:
        voice = _insert(organization, voice_uuid, relative, original, stats.to_json(), mode, upload)
    except BaseException:
        files.remove_file(relative)
        files.remove_file(original)
        raise
    return voice


def _keep_original(
    upload_path: str, organization: Organization, voice_uuid: uuid.UUID, container: str
) -> str:
    if not settings.TTS_KEEP_VOICE_ORIGINALS:
        return ""
    import shutil

    relative = f"voices/{organization.pk}/{voice_uuid.hex}.original.{container}"
    shutil.copyfile(upload_path, files.media_path(relative))
    return relative


def _insert(
    organization: Organization,
    voice_uuid: uuid.UUID,
    relative: str,
    original: str,
    stats: dict[str, Any],
    mode: str,
    upload: VoiceUpload,
) -> Voice:
    now = timezone.now()
    with transaction.atomic(durable=True):
        # The tenant row is the lock: parallel uploads cannot both take the last voice slot.
        if upload.consent is not None:
            _consent_active(upload.consent)  # before the tenant: a revocation locks it before jobs and tenant
        org = locks.lock_tenant(organization.pk)
        if not upload.one_off:  # a request's prompt takes no voice slot: its job's end removes it
            _check_room(org)
        if upload.unique_name:
            check_name_free(org, upload.name)  # under the tenant's lock: two uploads cannot both take it
        voice = Voice.objects.create(
            id=voice_uuid,
            voice_id=f"voice-{voice_uuid.hex}",
            organization=org,
            name=upload.name,
            engine="",
            language="",
            sample_rate=stats.get("source_rate", 16000),
            status=Voice.Status.PROCESSING,
            status_reason="analysing the prompt",
            prompt_path=relative,
            prompt_bytes=os.path.getsize(files.media_path(relative)),
            original_path=original,
            transcript=upload.transcript,
            description=upload.description,
            one_off=upload.one_off,
            consent_by=upload.consent_by,
            consent_by_label=upload.consent_label[:300],
            consent_at=now,
            cloning_mode=mode,
            consent=upload.consent,
            prompt_stats=stats,
            created_at=now,
        )
        pk = voice.pk
        transaction.on_commit(lambda: dispatch.send_analysis(pk))
    return voice


def check_name_free(organization: Organization, name: str) -> None:
    if organization.voices.filter(
        name__iexact=name, status__in=[Voice.Status.PROCESSING, Voice.Status.READY], one_off=False
    ).exists():
        raise DomainError(
            ErrorCode.VOICE_NAME_TAKEN,
            f"Voice '{name}' already exists; delete it first (DELETE /v1/audio/voices/{name}).",
            field="name",
        )


def _consent_active(consent: VoiceConsent) -> None:
    """The consent a voice names is still in force (its row locked: a revocation waits for the commit)."""
    active = VoiceConsent.objects.select_for_update().filter(pk=consent.pk, status=VoiceConsent.Status.ACTIVE)
    if not active.exists():
        raise DomainError(
            ErrorCode.CONSENT_REVOKED, f"Consent {consent.consent_id} was revoked.", field="consent"
        )


# --------------------------------------------------------------------- analysis (worker side)


def claim_analysis(voice_pk: Any) -> Voice | None:
    """Take a processing voice for analysis under a lease; None if it is not ours to analyse.

    A redelivered message (its worker died) finds the lease expired and takes
    it again; after TTS_ANALYSIS_MAX_ATTEMPTS such deaths the voice is rejected.
    """
    # The lease is set and judged by the database clock: the analysis workers of several hosts share it.
    lease = Now() + dt.timedelta(seconds=settings.TTS_ANALYSIS_TIME_LIMIT_SECONDS + 60)
    claimable = Q(pk=voice_pk, status=Voice.Status.PROCESSING) & (
        Q(analysis_lease_until__isnull=True) | Q(analysis_lease_until__lt=Now())
    )
    with transaction.atomic(durable=True):
        claimed = Voice.objects.filter(claimable).update(
            analysis_lease_until=lease,
            analysis_attempts=F("analysis_attempts") + 1,
            updated_at=timezone.now(),
        )
        voice = Voice.objects.filter(pk=voice_pk).first() if claimed else None
    if voice is not None and voice.analysis_attempts > settings.TTS_ANALYSIS_MAX_ATTEMPTS:
        reject_voice(voice_pk, "analysis_failed", "the analysis of this prompt failed repeatedly")
        return None
    return voice


def finish_analysis(voice_pk: Any, profile: Any, closest: Any, builtin: Voice | None) -> bool:
    """Store the analysis and make the voice ready (False if it was deleted meanwhile).

    ``builtin``: the built-in voice an approximate voice speaks through (``closest`` says how
    close); None for a zero_shot voice, which no engine is bound to (the submit picks one).
    """
    fields: dict[str, Any] = {
        "status": Voice.Status.READY,
        "status_reason": "",
        "embedding": profile.embedding,
        "pitch_median_hz": profile.median_f0,
        "pitch_low_hz": profile.f0_low,
        "pitch_high_hz": profile.f0_high,
        "analysis_lease_until": None,
        "updated_at": timezone.now(),
    }
    if builtin is not None:
        fields.update(
            closest_voice=closest.voice_id,
            closest_similarity=closest.similarity,
            pitch_shift=closest.pitch_shift,
            engine=builtin.engine,
            language=builtin.language,
            sample_rate=builtin.sample_rate,
            capabilities={**(builtin.capabilities or {}), "cloning": False},
        )
    with transaction.atomic(durable=True):
        updated = Voice.objects.filter(pk=voice_pk, status=Voice.Status.PROCESSING).update(**fields)
        if updated:
            announce_voice(Voice.objects.get(pk=voice_pk))
    return bool(updated)


def announce_voice(voice: Voice) -> None:
    """The voice's analysis decided it (ready, rejected): its event, in the transaction that decided it."""
    if voice.organization_id is None:
        return  # a built-in voice: no tenant to tell
    events.publish(events.VoiceDecided(voice.pk, voice.organization_id, str(voice.status)))


def reject_voice(voice_pk: Any, code: str, reason: str) -> bool:
    """End a processing voice ``rejected`` and remove its prompt files at once (nothing to keep)."""
    with transaction.atomic(durable=True):
        voice = Voice.objects.select_for_update().filter(pk=voice_pk, status=Voice.Status.PROCESSING).first()
        if voice is None:
            return False
        paths = [voice.prompt_path, voice.original_path]
        voice.status = Voice.Status.REJECTED
        voice.rejected_code = code
        voice.status_reason = reason[:500]
        voice.prompt_path = voice.original_path = ""
        voice.prompt_bytes = 0
        voice.embedding = None
        voice.analysis_lease_until = None
        voice.save()
        announce_voice(voice)
        transaction.on_commit(lambda: [files.remove_file(p) for p in paths])
    log.info("voice %s rejected: %s %s", voice_pk, code, reason)
    return True


# --------------------------------------------------------------------- using and deleting


def speaking_voice(
    voice: Voice, speaker: Voice | None = None, approximate: bool = False
) -> tuple[str, str, float, str]:
    """(voice id, engine, pitch shift, cloning mode) a job with ``voice`` is synthesised with.

    ``speaker``: for a zero_shot voice, the cloning voice chosen at submit (any model that
    clones: the submission picks it); without one, the engine it was analysed with, if any.
    ``approximate``: ``speaker`` is instead the voice's closest built-in voice, standing in for a
    clone the request let fall back (``voice_fallback: closest``), with the voice's measured shift.
    """
    if voice.organization_id is None or not voice.cloning_mode:
        return voice.voice_id, voice.engine, 0.0, ""
    if approximate and speaker is not None:
        return speaker.voice_id, speaker.engine, float(voice.pitch_shift), APPROXIMATE
    if voice.cloning_mode == APPROXIMATE:
        return voice.closest_voice, voice.engine, float(voice.pitch_shift), APPROXIMATE
    # zero_shot: the engine's cloning voice speaks, given the prompt (runtime/attempt.py, voice_prompt).
    if speaker is not None:
        return speaker.voice_id, speaker.engine, 0.0, ZERO_SHOT
    return voice.closest_voice, voice.engine, 0.0, ZERO_SHOT


def job_voice(
    voice: Voice,
    params: dict[str, Any],
    now: dt.datetime,
    speaker: Voice | None = None,
    approximate: bool = False,
) -> tuple[str, str, dict[str, Any], str]:
    """Inside submit's transaction: (voice id, engine, params, cloning mode) the job is created with.

    ``approximate`` adds the voice's pitch shift to the request's own (within
    the engines' range); using a tenant voice stamps its last use (retention report).
    """
    from synth.registry import PITCH_RANGE

    name, engine, shift, mode = speaking_voice(voice, speaker, approximate)
    if shift:
        pitch = float(params.get("pitch", 0.0)) + shift
        params = {**params, "pitch": round(min(max(pitch, PITCH_RANGE[0]), PITCH_RANGE[1]), 2)}
    if voice.organization_id is not None:
        Voice.objects.filter(pk=voice.pk).update(last_used_at=now)
    return name, engine, params, mode


def speaker_mismatch(
    consent: VoiceConsent, consent_embedding: list[float], embedding: list[float]
) -> str | None:
    """Why a prompt of ``embedding`` is not the speaker of the consent's recording, or None when it is."""
    from synth import consent as consent_check

    similarity = consent_check.speaker_similarity(consent_embedding, embedding)
    log.info("consent %s: speaker similarity %.3f", consent.consent_id, similarity)
    if similarity >= consent_check.SAME_SPEAKER_THRESHOLD:
        return None
    return (
        f"the consent recording ({consent.consent_id}) is not the prompt's speaker "
        f"(similarity {similarity:.2f}, at least {consent_check.SAME_SPEAKER_THRESHOLD:.2f} needed)"
    )


def attach_consent(organization: Organization, voice: Voice, consent: VoiceConsent) -> Voice:
    """Make a ready voice cloneable under a recorded consent of the same speaker, without a re-upload.

    The consent's embedding is the analysis worker's (queued when it was recorded): until it is
    there, ``409 consent_not_ready`` with Retry-After. Another speaker's consent is ``422
    consent_mismatch`` (``check: speaker``). The voice becomes ``zero_shot`` where a model clones.
    """
    if voice.organization_id != organization.pk:
        raise DomainError(ErrorCode.BUILTIN_VOICE, "A built-in voice takes no consent.")
    if voice.status != Voice.Status.READY or not voice.embedding:
        raise DomainError(ErrorCode.VOICE_NOT_READY, f"Voice {voice.voice_id} is {voice.status}, not ready.")
    if consent.embedding is None:
        raise DomainError(
            ErrorCode.CONSENT_NOT_READY,
            f"Consent {consent.consent_id}'s recording is still being analysed; retry in a few seconds.",
            retry_after=2,
        )
    mismatch = speaker_mismatch(consent, list(consent.embedding), list(voice.embedding))
    if mismatch is not None:
        raise DomainError(ErrorCode.CONSENT_MISMATCH, mismatch, field="consent", extra={"check": "speaker"})
    with transaction.atomic(durable=True):
        _consent_active(consent)
        fields: dict[str, Any] = {"consent": consent, "updated_at": timezone.now()}
        if cloning_modes()[ZERO_SHOT]:
            fields["cloning_mode"] = ZERO_SHOT
        Voice.objects.filter(pk=voice.pk, status=Voice.Status.READY).update(**fields)
    return Voice.objects.get(pk=voice.pk)


def consent_refusal(voice: Voice) -> str | None:
    """Why ``voice`` may not be cloned now (``no_consent``, ``consent_revoked``), or None when it may."""
    if voice.consent_id is None:
        return "no_consent"
    consent = VoiceConsent.objects.filter(pk=voice.consent_id).values_list("status", flat=True).first()
    if consent is None:
        return "no_consent"
    return None if consent == VoiceConsent.Status.ACTIVE else "consent_revoked"


def voice_prompt(voice: Voice | None) -> VoicePrompt | None:
    """What a cloning engine gets for a zero_shot job (None when the voice is gone)."""
    from synth.engines.base import VoicePrompt
    from synth.prompt import CANONICAL_RATE

    if voice is None or not voice.prompt_path:
        return None
    embedding = tuple(float(x) for x in voice.embedding or ())
    return VoicePrompt(
        files.media_path(voice.prompt_path),
        CANONICAL_RATE,
        voice.transcript,
        embedding,
        key="" if voice.one_off else str(voice.pk),  # a one-off voice is never kept upstream
        consent=str(voice.consent_id or ""),
    )


def remove_voice_files(voice: Voice) -> None:
    """Inside the caller's transaction: the voice's prompt and original go once it commits."""
    paths = [p for p in (voice.prompt_path, voice.original_path) if p]
    if paths:
        transaction.on_commit(lambda: [files.remove_file(p) for p in paths])


def decided(voice: Voice, seconds: float, poll: float = 0.25) -> Voice:
    """The voice once its analysis ended (ready or rejected), or as it is after ``seconds``: for a
    request that answers only with a usable voice (vLLM-Omni's upload, a request's ref_audio)."""
    deadline = time.monotonic() + seconds
    while voice.status == Voice.Status.PROCESSING and time.monotonic() < deadline:
        if not connection.in_atomic_block:
            connection.close()  # back to the pool (ASGI) while it sleeps
        time.sleep(poll)
        voice.refresh_from_db()
    return voice


def unused_voices(now: dt.datetime | None = None) -> Any:
    """Tenant voices not used for TTS_VOICE_RETENTION_DAYS (listed in the admin, not deleted)."""
    cutoff = (now or timezone.now()) - dt.timedelta(days=settings.TTS_VOICE_RETENTION_DAYS)
    return Voice.objects.filter(organization__isnull=False, status=Voice.Status.READY).filter(
        Q(last_used_at__lt=cutoff) | Q(last_used_at__isnull=True, created_at__lt=cutoff)
    )
