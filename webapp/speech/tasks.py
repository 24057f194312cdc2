"""Celery tasks: thin wrappers around ``speech.services`` and ``synth``."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from webapp.speech import services, worker

log = logging.getLogger(__name__)


@shared_task(name="speech.synthesize_job", acks_late=True, reject_on_worker_lost=True)
def synthesize_job(job_id: str) -> None:
    from synth import SynthesisRequest
    from synth.errors import Cancelled, SynthError

    state = worker.current()
    job = services.claim_job(job_id, state.worker_id)
    if job is None:
        return
    queue_ms = int((timezone.now() - job.created_at).total_seconds() * 1000)
    relative = os.path.join("audio", str(job.organization_id), f"{job.id}.{job.format}")
    out_path = services.audio_abspath(relative)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    params = job.params or {}
    request = SynthesisRequest(
        text=job.text,
        voice=job.voice_name,
        format=job.format,
        sample_rate=job.sample_rate,
        speed=float(params.get("speed", 1.0)),
        pitch=float(params.get("pitch", 0.0)),
        volume=float(params.get("volume", 0.0)),
        language=params.get("language"),
        instructions=params.get("instructions"),
    )
    cancel_flag = {"stop": False}

    def progress(done: int, total: int) -> None:
        cancel_flag["stop"] = services.report_progress(job_id, state.worker_id, done, total)

    started = time.monotonic()
    try:
        result = state.synthesizer.synthesize(
            request, out_path, progress=progress, should_cancel=lambda: cancel_flag["stop"]
        )
    except Cancelled:
        services.finish_canceled(job_id)
        return
    except SynthError as exc:
        services.fail_job(job_id, exc.code, exc.message, worker_id=state.worker_id)
        return
    metrics: dict[str, Any] = {
        "queue_ms": queue_ms,
        "synth_ms": result.synth_ms,
        "rtf": result.rtf,
        "audio_seconds": result.duration_seconds,
        "peak_rss_mb": result.peak_rss_mb,
        "peak_gpu_mb": result.peak_gpu_mb,
        "engine": result.engine,
        "device": result.device,
        "worker": state.worker_id,
        "wall_ms": int((time.monotonic() - started) * 1000),
    }
    done = services.complete_job(
        job_id,
        state.worker_id,
        audio_path=relative,
        audio_bytes=result.bytes,
        duration_seconds=result.duration_seconds,
        metrics=metrics,
        applied_instructions={"applied": result.applied, "not_applied": result.not_applied},
    )
    if not done:
        # Lost ownership meanwhile (canceled or re-claimed): our file is not the job's.
        try:
            os.unlink(out_path)
        except FileNotFoundError:
            pass
    state.tasks_done += 1
    _ = settings
