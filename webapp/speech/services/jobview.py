"""A synthesis job as every wire shows it: the one place a job becomes a dictionary.

The API's job resource, the dashboard's page script, the webhooks' ``job.*`` payloads and
the timestamps/captions documents all render a :class:`JobView`. What differs between them
is written here, side by side, so a field added to one is a decision about the others:

- the links: the API's are absolute when a request is at hand (a key's client fetches
  them), the dashboard's are its own session URLs, a webhook's are built on
  ``TTS_PUBLIC_ORIGIN`` (no request exists where it is made);
- what each shows: the dashboard needs no text or metrics, a webhook says what ended and
  where its audio is, the timestamps document is the job's timing.

tests/unit/test_conventions.py fails when another module renders a job itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.urls import reverse

from webapp.api_fields import iso
from webapp.speech.models import SpeechSession, SynthesisJob
from webapp.speech.services.eta import estimate

Status = SynthesisJob.Status
METRIC_KEYS = ("queue_ms", "synth_ms", "rtf", "peak_rss_mb", "peak_gpu_mb", "engine", "device", "worker")


def public_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a tenant sees of a run: no host names or pids (they stay in the row, for logs and the admin).

    ``worker`` is an opaque label of the worker process, enough to tell runs apart.
    """
    public = {k: metrics.get(k) for k in METRIC_KEYS}
    if public["worker"]:
        public["worker"] = "w-" + hashlib.sha256(str(public["worker"]).encode()).hexdigest()[:12]
    return public


def pinned_dictionaries(job: SynthesisJob) -> list[dict[str, Any]]:
    """The job's pinned versions, with what the run applied of each once it ran."""
    ran = {
        (d.get("id"), d.get("version")): d for d in (job.applied_instructions or {}).get("dictionaries", [])
    }
    out = []
    for pin in job.dictionaries or []:
        entry = {"id": pin["id"], "version": pin["version"], "name": pin["name"]}
        done = ran.get((pin["id"], pin["version"]))
        if done is not None:
            entry.update(rules_applied=done.get("rules_applied"), replacements=done.get("replacements"))
        out.append(entry)
    return out


@dataclass(frozen=True)
class JobView:
    """One job, read once; each ``for_*`` method is one wire's rendering of it."""

    job: SynthesisJob

    @property
    def has_audio(self) -> bool:
        return self.job.status == Status.SUCCEEDED and bool(self.job.audio_path)

    @property
    def error(self) -> dict[str, str] | None:
        job = self.job
        return {"code": job.error_code, "message": job.error_message} if job.error_code else None

    def _progress(self) -> dict[str, Any]:
        """What a waiting client polls: the state, how far, and how long to go (read once per call)."""
        eta_seconds, position = estimate(self.job)
        return {
            "id": str(self.job.id),
            "status": self.job.status,
            "progress": round(float(self.job.progress), 4),
            "queue_position": position,
            "eta_seconds": eta_seconds,
        }

    def for_api(self, absolute: Callable[[str], str] | None = None) -> dict[str, Any]:
        """The API's job resource (docs/api.md); ``absolute`` makes a path a URL (the request's)."""
        job = self.job
        audio_url = None
        if self.has_audio:
            path = reverse("api-speech-audio", args=[job.id])
            audio_url = absolute(path) if absolute is not None else path
        progress = self._progress()
        return {
            "id": progress["id"],
            "status": progress["status"],
            "text_chars": job.text_chars,
            "voice": job.voice_name,
            "format": job.format,
            "lane": job.lane,
            "progress": progress["progress"],
            "queue_position": progress["queue_position"],
            "eta_seconds": progress["eta_seconds"],
            "created_at": iso(job.created_at),
            "started_at": iso(job.started_at),
            "finished_at": iso(job.finished_at),
            "expires_at": iso(job.expires_at),
            "audio_url": audio_url,
            "duration_seconds": job.duration_seconds,
            "pronunciation_dictionaries": pinned_dictionaries(job),
            "cached_characters": job.cached_characters,
            "metrics": public_metrics(job.metrics or {}),
            "error": self.error,
        }

    def for_dashboard(self) -> dict[str, Any]:
        """What the page's script needs; its audio URLs are the dashboard's own (a session, not a key)."""
        audio = reverse("dashboard:job-audio", args=[self.job.id])
        return {
            **self._progress(),
            "duration_seconds": self.job.duration_seconds,
            "audio_url": audio if self.has_audio else None,
            "download_url": f"{audio}?download=1" if self.has_audio else None,
            "error": self.error,
        }

    def for_webhook(self, origin: str) -> dict[str, Any]:
        """A ``job.<status>`` event's data: what ended, and where its resource and audio are."""
        job = self.job
        data: dict[str, Any] = {
            "id": str(job.id),
            "status": str(job.status),
            "voice": job.voice_name,
            "format": job.format,
            "text_chars": job.text_chars,
            "url": origin + reverse("api-speech-detail", args=[job.id]),
        }
        if self.has_audio:
            data["audio_url"] = origin + reverse("api-speech-audio", args=[job.id])
            data["duration_seconds"] = job.duration_seconds
        if job.status == Status.FAILED:
            data["error"] = self.error
        return data

    def for_timestamps(self, words: list[Any], sentences: list[Any]) -> dict[str, Any]:
        """The timestamps document (JSON on the API; what the SRT and WebVTT writers read)."""
        return {
            "job_id": str(self.job.id),
            "duration_seconds": self.job.duration_seconds,
            "words": words,
            "sentences": sentences,
        }


def session_view(session: SpeechSession) -> dict[str, Any]:
    """A realtime session as the API's history and its ``session.completed`` webhook show it."""
    return {
        "id": str(session.id),
        "object": "speech.session",
        "protocol": session.protocol,
        "status": session.status,
        "voice": session.voice_name,
        "format": session.format,
        "contexts": session.contexts,
        "units": session.units,
        "received_characters": session.received_chars,
        "charged_characters": session.charged_chars,
        "audio_seconds": session.audio_seconds,
        "close_code": session.close_code,
        "close_reason": session.close_reason,
        "created_at": iso(session.created_at),
        "ended_at": iso(session.ended_at),
    }
