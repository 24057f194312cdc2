"""The analysis runner: speaker analysis of uploaded voice prompts (torch lives only here).

A worker started with ``TTS_WORKER_ROLE=analysis`` consumes the ``analysis``
queue. Like the synthesis workers it acks late (a dead child's message comes
back), claims the voice under a lease with an attempt count
(``services.prompts.claim_analysis``; the task is ``tasks.analyse_voice``), runs under soft/hard time limits, and
its child is recycled through the same health check (RSS growth, age) and
exit hook as a synthesis child (webapp/speech/runtime/recycling.py): torch keeps
memory it once touched.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init
from django.conf import settings

from webapp.speech.models import Voice, VoiceConsent
from webapp.speech.runtime import recycling
from webapp.speech.services import prompts
from webapp.speech.services.files import media_path

log = logging.getLogger(__name__)

_state: dict[str, Any] = {"tasks": 0, "health": None, "synth": None}
_lock = threading.Lock()


@worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    if settings.TTS_WORKER_ROLE != "analysis":
        return
    # Without billiard's mem_rss to hook (logged), a check with no limits: Celery's own replace the child.
    _state["health"] = recycling.health_for_child()


def analyse(voice_pk: str) -> str:
    """One delivery of an analysis message: analyse the voice, or reject it with a reason."""
    outcome = "skipped"
    try:
        outcome = _analyse(voice_pk)
    except SoftTimeLimitExceeded:
        prompts.reject_voice(voice_pk, "analysis_failed", "the analysis ran past its time limit")
        outcome = "rejected:timeout"
    finally:
        _after_task()
    log.info("analysis of voice %s: %s", voice_pk, outcome)
    return outcome


def _after_task() -> None:
    health = _state["health"]
    _state["tasks"] += 1
    if health is None:
        return
    if _state["tasks"] == 1:
        health.set_baseline()  # torch and the encoder are loaded now: growth counts from here
        return
    reason = health.check(tasks_done=_state["tasks"])
    if reason:
        recycling.request_exit(reason)


def _synthesizer() -> Any:
    from synth import Synthesizer

    with _lock:
        if _state["synth"] is None:
            _state["synth"] = Synthesizer(device="cpu", voices_dir=settings.TTS_VOICES_DIR, threads=1)
        return _state["synth"]


def _analyse(voice_pk: str) -> str:
    import soundfile as sf

    from synth import speaker
    from synth.prompt import PromptStats

    voice = prompts.claim_analysis(voice_pk)
    if voice is None:
        return "skipped"
    audio, rate = sf.read(media_path(voice.prompt_path), dtype="float32")
    profile = speaker.profile(audio, int(rate))
    refused = speaker.rejection(PromptStats(**voice.prompt_stats), profile)
    if refused is not None:
        prompts.reject_voice(voice_pk, *refused)
        return f"rejected:{refused[0]}"
    if voice.consent_id is not None:
        mismatch = _consent_mismatch(voice, profile.embedding)
        if mismatch is not None:
            prompts.reject_voice(voice_pk, "consent_mismatch", mismatch)
            return "rejected:consent_mismatch"
    if voice.cloning_mode == prompts.ZERO_SHOT:
        # Bound to no engine: any model that clones speaks it, chosen per request at submit
        # (submission._cloning_voice); the analysis only checked the prompt is usable.
        return "ready" if prompts.finish_analysis(voice_pk, profile, None, None) else "deleted"
    builtin, closest = _closest_voice(profile)
    if builtin is None:
        prompts.reject_voice(voice_pk, "analysis_failed", "no built-in voice is available to speak with")
        return "rejected:no_voice"
    return "ready" if prompts.finish_analysis(voice_pk, profile, closest, builtin) else "deleted"


def _closest_voice(profile: Any) -> tuple[Any, Any]:
    """approximate: the built-in voice row that will speak, and how close it comes."""
    from synth import speaker

    builtins = Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY)
    synth = _synthesizer()
    known = set(builtins.values_list("voice_id", flat=True))
    ids = speaker.candidate_voice_ids(v for v in synth.voices() if v.id in known)
    if not ids:
        return None, None
    cache = str(settings.TTS_VAR_LAYOUT.cache_dir / "voice-profiles.json")
    work = os.path.join(str(settings.MEDIA_ROOT), "tmp")
    os.makedirs(work, exist_ok=True)
    candidates = speaker.candidate_profiles(ids, speaker.synthesizer_fn(synth, work), cache)
    closest = speaker.approximate_voice(
        profile, candidates, lambda s: speaker.synthesizer_fn(synth, work, pitch=s)
    )
    return builtins.get(voice_id=closest.voice_id), closest


def consent_embedding(consent: VoiceConsent) -> list[float] | None:
    """The speaker embedding of the consent's recording, computed once and kept beside it (None when
    the recording went with its last voice)."""
    import soundfile as sf

    from synth import speaker

    if consent.embedding is not None:
        return list(consent.embedding)
    if not consent.recording_path:
        return None
    audio, rate = sf.read(media_path(consent.recording_path), dtype="float32")
    embedding = speaker.embed(audio, int(rate))
    VoiceConsent.objects.filter(pk=consent.pk, recording_path=consent.recording_path).update(
        embedding=embedding
    )
    return embedding


def embed_consent(consent_pk: str) -> str:
    """One delivery of a consent's embedding message."""
    try:
        consent = VoiceConsent.objects.filter(pk=consent_pk).first()
        outcome = "gone" if consent is None or consent_embedding(consent) is None else "embedded"
    finally:
        _after_task()
    log.info("embedding of consent %s: %s", consent_pk, outcome)
    return outcome


def _consent_mismatch(voice: Voice, embedding: list[float]) -> str | None:
    """Why the voice's consent recording is not its prompt's speaker, or None when it is."""
    consent = voice.consent
    if consent is None:
        return None
    known = consent_embedding(consent)
    if known is None:
        return "the consent's recording was deleted; record a new consent"
    return prompts.speaker_mismatch(consent, known, embedding)
