"""Celery tasks: the entry points of the worker runtime, nothing more.

``synthesize_job`` runs on an engine's queue (``synth.piper``, ``synth.espeak``);
its message is a wake-up, handled by ``runtime.delivery``. ``analyse_voice``
runs on the ``analysis`` queue (``runtime.analysis``). Services never import
this module: they send these tasks by name (``services.dispatch``).
"""

from __future__ import annotations

# The project's app, as every task of this service (not shared_task): a worker must use the
# configured broker.
from webapp.celery import app
from webapp.speech.runtime import analysis, delivery
from webapp.speech.services.dispatch import ANALYSE_VOICE, EMBED_CONSENT, SYNTHESIZE_JOB


@app.task(name=SYNTHESIZE_JOB, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def synthesize_job(job_id: str, limits: list[float] | None = None) -> str:
    """Wake-up for ``job_id``; ``limits`` = (soft, hard) seconds of that job, from dispatch."""
    return delivery.deliver(job_id, limits)


@app.task(name=ANALYSE_VOICE, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def analyse_voice(voice_pk: str) -> str:
    """Speaker analysis of an uploaded voice prompt."""
    return analysis.analyse(voice_pk)


@app.task(name=EMBED_CONSENT, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def embed_consent(consent_pk: str) -> str:
    """The speaker embedding of a consent recording, which voices naming it are compared with."""
    return analysis.embed_consent(consent_pk)
