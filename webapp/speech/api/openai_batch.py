"""``POST /v1/audio/speech/batch``: vLLM-Omni's batch of speech items, each an ordinary job.

The body is vLLM-Omni's ``BatchSpeechRequest``: ``items`` (1 to ``MAX_ITEMS``, each at least an
``input``) and the fields every item shares unless it sets its own (``voice``, ``response_format``,
``speed``, ...; ``model`` only for the whole batch). Each item is validated and submitted as
``/v1/audio/speech`` would be, so it is a job of its own with its own charge, quota, history and
Idempotency-Key (the batch's, derived per item). An item refused (a bad field, an unknown voice,
the quota) is an error in its place; the others run. The request then waits for its jobs, up to
``TTS_OPENAI_WAIT_SECONDS`` in all, and answers as vLLM-Omni does: ``{"id", "results": [{"index",
"status": "success"|"error", "audio_data" (base64), "media_type", "usage"} | {"index", "status",
"error"}], "total", "succeeded", "failed"}``.

Bounds: the items' characters together at most the plan's per-request maximum (one batch is one
request: 413 ``request_too_large``, nothing submitted), and the answer at most
``TTS_OPENAI_BATCH_MAX_BYTES`` of base64 audio (413 once the audio is known, and then nothing is
charged). A job is charged once the answer holding its audio is built; one that did not finish in
time is canceled and not charged, as one the client left (it went away while waiting).
"""

from __future__ import annotations

import base64
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from synth.audio import content_type
from webapp.errors import DomainError, ErrorCode
from webapp.problems import render
from webapp.speech import lifecycle
from webapp.speech.api.openai import IgnoreAccept, leave, not_delivered, submit_speech
from webapp.speech.api.serializers import OpenAISpeechSerializer
from webapp.speech.api.views import TenantAPIView
from webapp.speech.api.waiting import WaitingAPIView
from webapp.speech.models import SynthesisJob
from webapp.speech.services.files import media_path
from webapp.speech.services.ledger import reports
from webapp.speech.services.waiting import Wait, WaiterLease, WaitSlot, wait_view

MAX_ITEMS = 32  # vLLM-Omni's default batch limit
# vLLM-Omni's SpeechBatchItem: what an item may set for itself, over the batch's own value.
ITEM_FIELDS = (
    "voice",
    "speaker",
    "instructions",
    "response_format",
    "sample_rate",
    "speed",
    "task_type",
    "language",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "max_new_tokens",
    "initial_codec_chunk_frames",
    "non_streaming_mode",
)
# Ours, which an item takes from the batch as /v1/audio/speech takes them from its body.
OUR_FIELDS = ("seed", "cache", "voice_fallback")
DEFAULT_FORMAT = "wav"  # vLLM-Omni's batch default (its single request's is OpenAI's mp3 here)


@dataclass
class Plan:
    """What the answer is built from: each item's error, or its job."""

    errors: dict[int, str] = field(default_factory=dict)
    jobs: dict[int, Any] = field(default_factory=dict)
    total: int = 0


def item_bodies(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each item as a /v1/audio/speech body: its own fields over the batch's; 400 for a batch that
    is not one (no items, too many, an item that is not an object with an input)."""
    items = body.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            f"items must be a list of 1 to {MAX_ITEMS} speech items.",
            field="items",
        )
    bodies = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("input"), str):
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"items[{index}] must be an object with an input text.",
                field="items",
            )
        merged: dict[str, Any] = {"model": body.get("model"), "input": item["input"], "stream": False}
        for name in (*ITEM_FIELDS, *OUR_FIELDS):
            value = item.get(name) if name in ITEM_FIELDS else None
            merged[name] = value if value is not None else body.get(name)
        merged["response_format"] = merged["response_format"] or DEFAULT_FORMAT
        bodies.append({k: v for k, v in merged.items() if v is not None})
    return bodies


def _message(error: DomainError | ValidationError) -> str:
    if isinstance(error, DomainError):
        return error.message
    detail = error.detail
    if isinstance(detail, dict):
        return "; ".join(
            f"{name}: {' '.join(str(m) for m in (msgs if isinstance(msgs, list) else [msgs]))}"
            for name, msgs in detail.items()
        )
    return " ".join(str(m) for m in (detail if isinstance(detail, list) else [detail]))


class OpenAIBatchSpeechView(WaitingAPIView, TenantAPIView):
    required_scopes = {"POST": "speech:write"}
    content_negotiation_class = IgnoreAccept

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT},
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER)],
        summary="vLLM-Omni's batch speech: up to 32 items, each its own job, answered together",
    )
    def post(self, request: Request) -> HttpResponseBase | Wait:
        body = request.data
        if not isinstance(body, dict):
            raise DomainError(ErrorCode.INVALID_REQUEST, "The body must be a JSON object.")
        bodies = item_bodies(body)
        chars = sum(len(b["input"]) for b in bodies)
        allowed = self.organization.plan.max_characters_per_request
        if chars > allowed:
            raise DomainError(
                ErrorCode.REQUEST_TOO_LARGE,
                f"The batch's items have {chars:,} characters together; your plan allows {allowed:,} in "
                "one request.",
                field="items",
            )
        wait = settings.TTS_OPENAI_WAIT_SECONDS
        slot = WaitSlot.take(self.organization, wait)  # before the submits: a refusal leaves no job
        plan = Plan(total=len(bodies))
        fresh = True
        try:
            for index, item in enumerate(bodies):
                try:
                    serializer = OpenAISpeechSerializer(data=item)
                    serializer.is_valid(raise_exception=True)
                    job, created = submit_speech(
                        request, self.organization, serializer.validated_data, False, item=index
                    )
                except (DomainError, ValidationError) as error:
                    plan.errors[index] = _message(error)
                    continue
                plan.jobs[index] = job.pk
                fresh = fresh and created
        except BaseException:
            slot.give_back()
            for job_id in plan.jobs.values():
                leave(job_id)  # submitted for an answer that will never be built
            raise
        if not plan.jobs:
            slot.give_back()
            return JsonResponse(batch_answer(plan))
        first, *others = plan.jobs.values()
        lease = WaiterLease(
            renew=lifecycle.renew_waiter,
            leave=leave,
            every=settings.TTS_WAITER_LEASE_SECONDS / 3,
            fresh=fresh,
        )
        return Wait(
            first,
            wait,
            lambda now: now[0] in SynthesisJob.FINISHED,
            slot=slot,
            lease=lease,
            answer=plan,
            others=tuple(others),
        )


def batch_answer(plan: Plan, results: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    results = dict(results or {})
    for index, message in plan.errors.items():
        results[index] = {"index": index, "status": "error", "error": message}
    ordered = [results[i] for i in sorted(results)]
    succeeded = sum(1 for r in ordered if r["status"] == "success")
    return {
        "id": f"speech-batch-{uuid.uuid4().hex}",
        "results": ordered,
        "total": plan.total,
        "succeeded": succeeded,
        "failed": plan.total - succeeded,
    }


def _error_of(job_id: Any) -> str:
    """Why a job has no audio for the answer, as /v1/audio/speech says it (a job still going is
    canceled there, not charged)."""
    return not_delivered(SynthesisJob.objects.get(pk=job_id)).message


def answer_after_wait(request: HttpRequest, wait: Wait) -> HttpResponseBase:
    """The batch's answer once its jobs finished or its time ran out: each item's audio or error."""
    plan: Plan = wait.answer
    rows = {
        row[0]: row[1:]
        for row in SynthesisJob.objects.filter(pk__in=plan.jobs.values()).values_list(
            "pk", "status", "audio_path", "format"
        )
    }
    done = {
        index: rows[job_id]
        for index, job_id in plan.jobs.items()
        if job_id in rows and rows[job_id][0] == SynthesisJob.Status.SUCCEEDED and rows[job_id][1]
    }
    for index, job_id in plan.jobs.items():
        if index not in done:
            plan.errors[index] = _error_of(job_id)
    paths = {index: media_path(audio_path) for index, (_, audio_path, _) in done.items()}
    encoded = sum(4 * ((os.path.getsize(path) + 2) // 3) for path in paths.values())
    if encoded > settings.TTS_OPENAI_BATCH_MAX_BYTES:
        for index in done:
            lifecycle.report_handed(plan.jobs[index], handing=lifecycle.Handing.LEFT)
        response = render(
            request,
            DomainError(
                ErrorCode.REQUEST_TOO_LARGE,
                f"The batch's audio is {encoded:,} bytes in base64; answers are limited to "
                f"{settings.TTS_OPENAI_BATCH_MAX_BYTES:,}. Nothing was charged: send fewer or shorter items.",
            ),
        )
    else:
        results: dict[int, dict[str, Any]] = {}
        for index, (_, _, fmt) in done.items():
            job_id = plan.jobs[index]
            with open(paths[index], "rb") as handle:
                audio = base64.b64encode(handle.read()).decode("ascii")
            results[index] = {
                "index": index,
                "status": "success",
                "audio_data": audio,
                "media_type": content_type(fmt),
                "usage": reports.speech_usage(reports.job_reserved(job_id)),
            }
            # Charged as the answer holding its audio is built (a replay's settled already: a no-op).
            lifecycle.report_handed(job_id, handing=lifecycle.Handing.WHOLE)
        response = JsonResponse(batch_answer(plan, results))
    for key, value in wait.headers.items():
        response[key] = value
    return response


# POST: DRF's dispatch in a thread (an answer at once when every item was refused), then the wait.
openai_speech_batch = wait_view(OpenAIBatchSpeechView.as_view(), answer_after_wait)
