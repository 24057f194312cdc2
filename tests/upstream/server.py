"""A fake vLLM-Omni text-to-speech server: the upstream the remote engine's integration tests talk to.

It speaks vLLM-Omni 0.30's HTTP surface (``vllm serve --omni``) closely enough that our service cannot
tell it from the real one at the protocol level, without a GPU or a model: the audio is real speech
from eSpeak NG (``synth.espeak_lib``), 16-bit mono PCM at 24 kHz.

    .venv-clients/bin/python -m tests.upstream.server --host 127.0.0.1 --port 8091 --replica a \
        [--model cosyvoice3] [--api-key KEY]

run from the repository root. It imports nothing from ``webapp``; it runs under the agent clients'
virtualenv (tests/clients/prepare.sh), where vLLM-Omni's wheel is installed without its
dependencies. Every JSON body is validated with vLLM-Omni's own request models, read from that wheel
by file path as tests/clients/vllm_omni_fields.py does (the package's ``__init__`` imports vLLM).

Routes, in vLLM-Omni's shapes (vllm_omni/entrypoints/openai/api_server.py, serving_speech.py):

- ``GET /health``, ``GET /v1/models``
- ``POST /v1/audio/speech``: a whole answer (any ``response_format``, with the ``X-VLLM-OMNI-*-TOKENS``
  usage headers), or with ``stream: true`` / ``stream_format: "sse"`` the ``speech.audio.delta`` and
  ``speech.audio.done`` SSE events, or with ``stream_format: "audio"`` raw pcm/wav bytes. A stream
  sends one chunk per sentence of ``input``, each as soon as it is synthesised. ``ref_audio`` is
  accepted (never fetched) and spoken in the default voice.
- ``POST /v1/audio/speech/batch``
- ``GET``/``POST /v1/audio/voices``, ``DELETE /v1/audio/voices/{name}`` (kept in memory)

One deliberate departure: vLLM-Omni ignores body fields its models do not declare. The fake
answers them with a 400 naming them, so a test sees a field the remote engine sends that the real
server would drop in silence (switch ``reject_unknown_fields`` off for the real behaviour).

For the tests, never behind ``--api-key``:

- ``GET /_control`` the switches; ``POST /_control`` merges a JSON object into them: ``fail_5xx``,
  ``hang`` (headers or nothing, then no audio until the client leaves), ``wrong_content_type``,
  ``capacity`` (speech requests in flight before 503s), ``chunk_delay_ms`` (before each streamed
  chunk), ``reject_unknown_fields``, ``registration_policy`` (vLLM-Omni's
  VLLM_OMNI_SPEAKER_REGISTRATION_POLICY: ``overwrite`` or ``immutable``), ``fail_voice_deletes``
  (``DELETE /v1/audio/voices/{name}`` answers 500 and deletes nothing), ``parts_per_sentence`` (a
  sentence's audio written in that many parts, ``chunk_delay_ms`` before each).
- ``GET /_stats``: ``requests_total``, ``in_flight`` and the last 200 speech requests, each with the
  id its ``X-Request-Id`` header carried (the client's own, if it sent one).

Every answer carries ``X-Upstream-Replica: NAME``. SIGTERM stops it cleanly; tests SIGKILL it to
simulate a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import dataclasses
import importlib.util
import io
import json
import logging
import re
import secrets
import time
import uuid
import wave
from collections.abc import Awaitable, Callable
from importlib.metadata import distribution
from types import ModuleType
from typing import Any, Literal
from urllib.parse import urlparse

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from synth.espeak_lib import DEFAULT_RATE, get_lib

logger = logging.getLogger("tests.upstream")

PROTOCOL_FILE = "vllm_omni/entrypoints/openai/protocol/audio.py"
NATIVE_RATE = 24000
SAMPLE_RATES = frozenset({8000, NATIVE_RATE})  # what vLLM-Omni's Qwen3-TTS adapter resamples to
# Presets as a CustomVoice model lists them; each is an English eSpeak voice. "default" is vLLM-Omni's
# placeholder name for the model's own voice.
PRESET_VOICES = {"alloy": "en-us", "vivian": "en-us", "ryan": "en"}
DEFAULT_VOICE = "default"
DEFAULT_ESPEAK_VOICE = "en-us"
OUTPUT_TOKENS_PER_SECOND = 25  # a codec's frame rate, for the usage counts only
BATCH_MAX_ITEMS = 32  # vLLM-Omni's default tts_batch_max_items
UPLOAD_MAX_BYTES = 10 * 1024 * 1024
UPLOAD_MIME_TYPES = frozenset(
    "audio/mpeg audio/wav audio/x-wav audio/ogg audio/aac audio/flac audio/webm audio/mp4".split()
)
UPLOAD_SUFFIX_MIME = {".wav": "audio/wav", ".mp3": "audio/mpeg", ".mpeg": "audio/mpeg", ".flac": "audio/flac"}
ENCODINGS = {  # response_format: (soundfile format, subtype, media type), as vLLM-Omni's AudioMixin
    "flac": ("FLAC", None, "audio/flac"),
    "mp3": ("MP3", None, "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
}
REFERENCE_AUDIO_FIELDS = frozenset({"ref_audio", "ref_audio_2", "audio_path"})  # audio_path: in `references`
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
WORD = re.compile(r"\w+|[^\w\s]")
# Parts of a pydantic error location that name its validators, not a field (vLLM drops them too).
INTERNAL_LOC = re.compile(r"[\[\]{}()]|^(function-\w+|union|tagged-union|nullable|default|chain)$")
RECORD = "speech_record"  # the request's SpeechRecord, under this key of the aiohttp request


class Switches(BaseModel):
    """What a test makes the server do, changed at runtime through POST /_control."""

    model_config = ConfigDict(extra="forbid")

    fail_5xx: bool = False
    hang: bool = False
    wrong_content_type: bool = False
    capacity: int | None = Field(default=None, ge=0)
    chunk_delay_ms: int = Field(default=0, ge=0)
    reject_unknown_fields: bool = True
    registration_policy: Literal["overwrite", "immutable"] = "overwrite"
    fail_voice_deletes: bool = False
    # Each sentence's audio written in this many parts, ``chunk_delay_ms`` before each: a model that
    # streams a sentence as it generates it. The parts split samples (an odd byte count) on purpose.
    parts_per_sentence: int = Field(default=1, ge=1, le=50)


@dataclasses.dataclass
class SpeechRecord:
    """One speech (or batch) request as /_stats reports it. ``bytes_sent`` counts audio bytes."""

    id: str
    path: str
    body: Any = None
    status: int | None = None
    chunks_sent: int = 0
    bytes_sent: int = 0
    finished: bool = False
    client_closed: bool = False


class Refused(Exception):
    """Ends a request with ``response`` (an error answer)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class BadRequest(ValueError):
    """The ValueError vLLM-Omni's handlers raise for a request they refuse: answered 400, type
    BadRequestError (create_error_response); in a batch, that item's error."""


def load_protocol() -> ModuleType:
    """vLLM-Omni's request and response models: that one file of its wheel, loaded by its path."""
    dist = distribution("vllm-omni")
    (path,) = [f for f in dist.files or [] if str(f) == PROTOCOL_FILE]
    spec = importlib.util.spec_from_file_location("vllm_omni_audio_protocol", str(dist.locate_file(path)))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def error_response(status: int, message: str, err_type: str, param: str | None = None) -> web.Response:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}``."""
    error = {"message": message, "type": err_type, "param": param, "code": status}
    return web.json_response({"error": error}, status=status)


def _dotted(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not INTERNAL_LOC.search(str(p))]
    return ".".join(["body", *parts])


def _summarised(value: Any) -> Any:
    # vLLM bounds what it echoes: a body with a data: URL in it is megabytes.
    if isinstance(value, list | tuple | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else value


def validation_failure(errors: list[dict[str, Any]]) -> Refused:
    """400 as vLLM's RequestValidationError handler words it; ``param`` is the first error's place."""
    lines = [
        f"  {dict(type=e['type'], loc=_dotted(tuple(e['loc'])), msg=e['msg'], input=_summarised(e.get('input')))}"
        for e in errors[:10]
    ]
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "\n".join(lines)
    return Refused(error_response(400, message, "Bad Request", _dotted(tuple(errors[0]["loc"]))))


def accepted_keys(model: type[BaseModel]) -> frozenset[str]:
    """The body keys ``model`` reads: field names and their aliases."""
    keys = set(model.model_fields)
    for field in model.model_fields.values():
        keys.update(c for c in getattr(field.validation_alias, "choices", None) or [] if isinstance(c, str))
    return frozenset(keys)


def unknown_fields(body: Any, known: frozenset[str], loc: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        return []
    return [
        {"type": "extra_forbidden", "loc": (*loc, k), "msg": "Extra inputs are not permitted", "input": v}
        for k, v in body.items()
        if k not in known
    ]


def redacted(body: Any) -> Any:
    """``body`` as /_stats shows it: each reference audio (a data: URL, megabytes) as its length."""
    if isinstance(body, list):
        return [redacted(v) for v in body]
    if not isinstance(body, dict):
        return body
    return {k: _audio_length(v) if k in REFERENCE_AUDIO_FIELDS else redacted(v) for k, v in body.items()}


def _audio_length(value: Any) -> Any:
    if isinstance(value, list):
        return [_audio_length(v) for v in value]
    return {"length": len(value)} if isinstance(value, str) else value


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text.strip()) if s.strip()]


def resample(pcm: bytes, source_rate: int, target_rate: int) -> bytes:
    """Linear interpolation: enough for a fake (eSpeak speaks at 22050 Hz)."""
    if source_rate == target_rate or not pcm:
        return pcm
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    count = round(len(samples) * target_rate / source_rate)
    positions = np.arange(count) * (source_rate / target_rate)
    out = np.interp(positions, np.arange(len(samples)), samples)
    return bytes(np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes())


def speak(text: str, espeak_voice: str, speed: float, rate: int) -> bytes:
    """``text`` as s16le mono PCM at ``rate``; blocking (eSpeak serialises its callers)."""
    lib = get_lib()
    pcm = lib.synth(text, espeak_voice, rate=round(DEFAULT_RATE * speed))
    return resample(pcm, lib.sample_rate, rate)


def wav_file(pcm: bytes, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return buffer.getvalue()


def streaming_wav_header(rate: int) -> bytes:
    """The header vLLM-Omni streams before WAV audio: both sizes 0xFFFFFFFF (unknown)."""
    header = wav_file(b"", rate)
    return header[:4] + b"\xff\xff\xff\xff" + header[8:40] + b"\xff\xff\xff\xff"


def encoded(pcm: bytes, rate: int, response_format: str) -> tuple[bytes, str]:
    """The whole answer's bytes and media type, per vLLM-Omni's AudioMixin."""
    if response_format == "pcm":
        return pcm, "audio/pcm"
    if response_format == "wav":
        return wav_file(pcm, rate), "audio/wav"
    import soundfile  # only .venv-clients has it; needed for flac, mp3 and opus only

    file_format, subtype, media_type = ENCODINGS[response_format]
    buffer = io.BytesIO()
    soundfile.write(buffer, np.frombuffer(pcm, dtype="<i2"), rate, format=file_format, subtype=subtype)
    return buffer.getvalue(), media_type


def usage(text: str, instructions: str | None, audio_bytes: int, rate: int) -> dict[str, Any]:
    """SpeechTokenUsage's shape; the counts are estimates (words in, codec frames out)."""
    text_tokens = len(WORD.findall(f"{text} {instructions or ''}"))
    output_tokens = audio_bytes // 2 * OUTPUT_TOKENS_PER_SECOND // rate
    return {
        "input_tokens": text_tokens,
        "output_tokens": output_tokens,
        "total_tokens": text_tokens + output_tokens,
        "input_token_details": {"text_tokens": text_tokens, "audio_tokens": 0},
    }


def usage_headers(counts: dict[str, Any]) -> dict[str, str]:
    details = counts["input_token_details"]
    return {
        "X-VLLM-OMNI-INPUT-TOKENS": str(counts["input_tokens"]),
        "X-VLLM-OMNI-OUTPUT-TOKENS": str(counts["output_tokens"]),
        "X-VLLM-OMNI-TOTAL-TOKENS": str(counts["total_tokens"]),
        "X-VLLM-OMNI-INPUT-TEXT-TOKENS": str(details["text_tokens"]),
        "X-VLLM-OMNI-INPUT-AUDIO-TOKENS": str(details["audio_tokens"]),
    }


def sse_event(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


class FakeVllmOmni:
    """The server's state and its handlers."""

    def __init__(self, model: str, replica: str, api_key: str | None) -> None:
        self.model = model
        self.replica = replica
        self.api_key = api_key
        self.protocol = load_protocol()
        self.speech_keys = accepted_keys(self.protocol.OpenAICreateSpeechRequest) | {"references"}
        self.batch_keys = accepted_keys(self.protocol.BatchSpeechRequest)
        self.item_keys = accepted_keys(self.protocol.SpeechBatchItem)
        self.switches = Switches()
        self.records: collections.deque[SpeechRecord] = collections.deque(maxlen=200)
        self.requests_total = 0
        self.in_flight = 0
        self.uploaded: dict[str, dict[str, Any]] = {}  # by lower-case name, as vLLM-Omni keeps them
        self.last_upload_ts = 0
        self.started = int(time.time())

    def app(self) -> web.Application:
        @web.middleware
        async def require_api_key(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            if self.api_key and request.path.startswith("/v1") and not self.authorized(request):
                return web.json_response({"error": "Unauthorized"}, status=401)  # vLLM's exact body
            return await handler(request)

        # Data URLs of reference audio and 10 MB uploads pass aiohttp's 1 MiB default.
        app = web.Application(middlewares=[require_api_key], client_max_size=64 * 1024 * 1024)
        app.on_response_prepare.append(self.tag_response)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_post("/v1/audio/speech/batch", self.speech_batch)
        app.router.add_get("/v1/audio/voices", self.list_voices)
        app.router.add_post("/v1/audio/voices", self.upload_voice)
        app.router.add_delete("/v1/audio/voices/{name}", self.delete_voice)
        app.router.add_get("/_control", self.get_control)
        app.router.add_post("/_control", self.set_control)
        app.router.add_get("/_stats", self.stats)
        return app

    def authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            token.encode(), str(self.api_key).encode()
        )

    async def tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every answer, streams and aiohttp's own errors included, just before its headers go."""
        response.headers["X-Upstream-Replica"] = self.replica
        record: SpeechRecord | None = request.get(RECORD)
        if record is not None:
            response.headers["X-Request-Id"] = record.id
            record.status = response.status

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def models(self, request: web.Request) -> web.Response:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": self.started,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": self.model,
            "object": "model",
            "created": self.started,
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": None,
            "permission": [permission],
        }
        return web.json_response({"object": "list", "data": [card]})

    # -- speech -----------------------------------------------------------------------------------

    async def speech(self, request: web.Request) -> web.StreamResponse:
        return await self.serve_speech(request, self.answer_speech)

    async def speech_batch(self, request: web.Request) -> web.StreamResponse:
        return await self.serve_speech(request, self.answer_batch)

    async def serve_speech(
        self,
        request: web.Request,
        answer: Callable[[web.Request, SpeechRecord, Any], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """What both speech routes share: the record, admission, the body's JSON, the switches."""
        record = SpeechRecord(
            id=request.headers.get("X-Request-Id") or f"speech-{uuid.uuid4().hex}", path=request.path
        )
        request[RECORD] = record
        self.records.append(record)
        self.requests_total += 1
        raw = await request.read()
        counted = False
        try:
            body = self.json_body(request, raw)
            record.body = redacted(body)
            capacity = self.switches.capacity
            if capacity is not None and self.in_flight >= capacity:
                # vLLM itself queues rather than refusing; this is what a saturated replica behind a
                # limiter (or one starting up) answers.
                message = f"The server is overloaded: {self.in_flight} speech requests in flight (capacity {capacity})"
                raise Refused(error_response(503, message, "Service Unavailable"))
            self.in_flight += 1
            counted = True
            response = await answer(request, record, body)
        except Refused as refused:
            response = refused.response
        except BadRequest as exc:
            response = error_response(400, str(exc), "BadRequestError")
        except asyncio.CancelledError:
            record.client_closed = True  # aiohttp cancels the handler when its client goes away
            raise
        finally:
            if counted:
                self.in_flight -= 1
        record.finished = not record.client_closed
        return response

    def injected(self) -> web.Response | None:
        """The answer a switch puts in place of speech, once the request passed every check."""
        if self.switches.fail_5xx:
            message = "Speech generation failed: injected failure (fail_5xx)"
            raise Refused(error_response(500, message, "InternalServerError"))
        if self.switches.wrong_content_type:
            return web.Response(text="<html><body>Not speech</body></html>", content_type="text/html")
        return None

    def json_body(self, request: web.Request, raw: bytes) -> Any:
        if request.content_type != "application/json":  # vLLM's validate_json_request
            message = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
            raise Refused(error_response(400, message, "Bad Request"))
        try:
            return json.loads(raw)
        except ValueError as exc:
            error = {
                "type": "json_invalid",
                "loc": (),
                "msg": "JSON decode error",
                "input": {},
                "error": str(exc),
            }
            raise validation_failure([error]) from None

    def validated(self, model: type[BaseModel], body: Any, unknown: list[dict[str, Any]]) -> Any:
        errors = unknown if self.switches.reject_unknown_fields else []
        try:
            # A copy: a before-validator pops `references` from the dict it is given.
            parsed = model.model_validate(dict(body) if isinstance(body, dict) else body)
        except ValidationError as exc:
            errors = errors + [dict(e) for e in exc.errors(include_url=False)]
        if errors:
            raise validation_failure(errors)
        return parsed

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            message = f"The model `{model}` does not exist."
            raise Refused(error_response(404, message, "NotFoundError", "model"))

    def espeak_voice(self, speech: Any) -> str:
        """The eSpeak voice ``speech`` is spoken in, after vLLM-Omni's checks (each a 400)."""
        if speech.sample_rate is not None and speech.sample_rate not in SAMPLE_RATES:
            rates = ", ".join(str(r) for r in sorted(SAMPLE_RATES))
            raise BadRequest(
                f"sample_rate={speech.sample_rate} is not supported by the current TTS model; supported rates: {rates}"
            )
        if not speech.input.strip():
            raise BadRequest("Input text cannot be empty")
        if speech.ref_audio is not None and (
            not isinstance(speech.ref_audio, str)
            or urlparse(speech.ref_audio).scheme.lower() not in {"http", "https", "data", "file"}
        ):
            raise BadRequest(
                "ref_audio must be a URL (http/https), base64 data URL (data:...), or file URI (file://...)"
            )
        name = (speech.voice or DEFAULT_VOICE).lower()
        if name == DEFAULT_VOICE or name in self.uploaded:
            return DEFAULT_ESPEAK_VOICE  # an uploaded voice is a clone: the fake speaks it plainly
        if name in PRESET_VOICES:
            return PRESET_VOICES[name]
        raise BadRequest(f"Invalid voice '{speech.voice}'. Supported: {', '.join(self.voice_names())}")

    async def answer_speech(
        self, request: web.Request, record: SpeechRecord, body: Any
    ) -> web.StreamResponse:
        unknown = unknown_fields(body, self.speech_keys)
        speech = self.validated(self.protocol.OpenAICreateSpeechRequest, body, unknown)
        self.check_model(speech.model)
        if speech.is_streaming() and speech.word_timestamps:
            raise BadRequest(
                "word_timestamps=true is currently supported by the WebSocket /v1/audio/speech/stream path."
            )
        if speech.word_timestamps:
            raise BadRequest("word_timestamps=true requires the server to be launched with --forced-aligner.")
        if speech.is_streaming() and speech.speed is not None and speech.speed != 1.0:
            mode = "SSE streaming" if speech.is_sse_stream() else "Streaming"
            raise BadRequest(
                f"{mode} is not supported with speed adjustment. "
                "Use a non-streaming request or remove the speed parameter."
            )
        espeak_voice = self.espeak_voice(speech)
        if (fake := self.injected()) is not None:
            return fake
        rate = speech.sample_rate or NATIVE_RATE
        if speech.is_streaming():
            return await self.stream_speech(request, record, speech, espeak_voice, rate)
        if self.switches.hang:
            await self.hang()
        pcm = await asyncio.to_thread(speak, speech.input, espeak_voice, speech.speed or 1.0, rate)
        audio, media_type = encoded(pcm, rate, speech.response_format)
        headers = usage_headers(usage(speech.input, speech.instructions, len(pcm), rate))
        record.chunks_sent, record.bytes_sent = 1, len(audio)
        return web.Response(body=audio, content_type=media_type, headers=headers)

    async def stream_speech(
        self, request: web.Request, record: SpeechRecord, speech: Any, espeak_voice: str, rate: int
    ) -> web.StreamResponse:
        """One chunk per sentence, each written as soon as it is spoken (after ``chunk_delay_ms``)."""
        content_type = "text/event-stream" if speech.is_sse_stream() else f"audio/{speech.response_format}"
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        if self.switches.hang:
            await self.hang()
        try:
            await self.stream_sentences(response, record, speech, espeak_voice, rate)
        except ConnectionResetError:  # a write to a client that went away
            record.client_closed = True
        return response

    async def stream_sentences(
        self, response: web.StreamResponse, record: SpeechRecord, speech: Any, espeak_voice: str, rate: int
    ) -> None:
        sse = speech.is_sse_stream()
        response_format = speech.response_format
        audio_bytes = 0
        for number, sentence in enumerate(sentences(speech.input)):
            pcm = await asyncio.to_thread(speak, sentence, espeak_voice, 1.0, rate)
            parts = self.switches.parts_per_sentence
            step = -(-len(pcm) // parts) | 1  # odd: the parts' edges fall inside samples
            pieces = [pcm[i : i + step] for i in range(0, len(pcm), step)] or [pcm]
            # vLLM-Omni sends a WAV stream's header as a chunk of its own, before the first audio.
            header = [streaming_wav_header(rate)] if number == 0 and response_format == "wav" else []
            for index, chunk in enumerate(header + pieces):
                if self.switches.chunk_delay_ms and index >= len(header):
                    await asyncio.sleep(self.switches.chunk_delay_ms / 1000)
                if sse:
                    audio = base64.b64encode(chunk).decode("ascii")
                    delta = {"type": "speech.audio.delta", "audio": audio, "response_format": response_format}
                    await response.write(sse_event(delta))
                else:
                    await response.write(chunk)
                record.chunks_sent += 1
                record.bytes_sent += len(chunk)
            audio_bytes += len(pcm)
        if sse:
            counts = usage(speech.input, speech.instructions, audio_bytes, rate)
            await response.write(sse_event({"type": "speech.audio.done", "usage": counts}))
        await response.write_eof()

    async def hang(self) -> None:
        """Until the client leaves: aiohttp then cancels the handler (handler_cancellation)."""
        await asyncio.get_running_loop().create_future()

    async def answer_batch(self, request: web.Request, record: SpeechRecord, body: Any) -> web.StreamResponse:
        unknown = unknown_fields(body, self.batch_keys)
        if isinstance(body, dict) and isinstance(body.get("items"), list):
            for index, item in enumerate(body["items"]):
                unknown += unknown_fields(item, self.item_keys, ("items", index))
        batch = self.validated(self.protocol.BatchSpeechRequest, body, unknown)
        self.check_model(batch.model)
        if len(batch.items) > BATCH_MAX_ITEMS:
            message = f"Batch contains {len(batch.items)} items, exceeding the maximum of {BATCH_MAX_ITEMS}."
            raise Refused(error_response(400, message, "Bad Request"))
        if (fake := self.injected()) is not None:
            return fake
        if self.switches.hang:
            await self.hang()
        results = await asyncio.gather(
            *(self.batch_item(i, batch, item) for i, item in enumerate(batch.items))
        )
        succeeded = sum(1 for r in results if r.status == "success")
        answer = self.protocol.BatchSpeechResponse(
            id=f"speech-batch-{uuid.uuid4().hex}",
            results=results,
            total=len(results),
            succeeded=succeeded,
            failed=len(results) - succeeded,
        )
        record.chunks_sent = 1
        record.bytes_sent = sum(len(r.audio_data or "") for r in results)
        return web.json_response(answer.model_dump(exclude_none=True))

    async def batch_item(self, index: int, batch: Any, item: Any) -> Any:
        """One item as vLLM-Omni runs it: the batch's defaults under the item's own fields."""
        Result = self.protocol.SpeechBatchItemResult

        def pick(name: str) -> Any:
            own = getattr(item, name, None)
            return own if own is not None else getattr(batch, name, None)

        try:
            speech = self.protocol.OpenAICreateSpeechRequest(
                input=item.input,
                model=batch.model,
                voice=pick("voice"),
                instructions=pick("instructions"),
                response_format=pick("response_format") or "wav",
                sample_rate=pick("sample_rate"),
                speed=pick("speed") if pick("speed") is not None else 1.0,
                ref_audio=pick("ref_audio"),
                ref_text=pick("ref_text"),
            )
            espeak_voice = self.espeak_voice(speech)
        except ValueError as exc:  # BadRequest, or pydantic's ValidationError
            return Result(index=index, status="error", error=str(exc))
        rate = speech.sample_rate or NATIVE_RATE
        pcm = await asyncio.to_thread(speak, speech.input, espeak_voice, speech.speed or 1.0, rate)
        audio, media_type = encoded(pcm, rate, speech.response_format)
        return Result(
            index=index,
            status="success",
            audio_data=base64.b64encode(audio).decode("ascii"),
            media_type=media_type,
            usage=usage(speech.input, speech.instructions, len(pcm), rate),
        )

    # -- voices -----------------------------------------------------------------------------------

    def voice_names(self) -> list[str]:
        return sorted({*PRESET_VOICES, *self.uploaded, DEFAULT_VOICE})

    async def list_voices(self, request: web.Request) -> web.Response:
        uploaded = []
        for info in self.uploaded.values():
            entry = {k: info[k] for k in ("name", "consent", "created_at", "file_size", "mime_type")}
            entry.update(embedding_source="audio", embedding_dim=None)
            entry.update({k: info[k] for k in ("ref_text", "speaker_description") if info.get(k)})
            uploaded.append(entry)
        return web.json_response({"voices": self.voice_names(), "uploaded_voices": uploaded})

    async def upload_voice(self, request: web.Request) -> web.Response:
        try:
            return web.json_response({"success": True, "voice": self.registered(await request.post())})
        except Refused as refused:
            return refused.response
        except BadRequest as exc:
            return error_response(400, str(exc), "BadRequestError")

    def registered(self, form: Any) -> dict[str, Any]:
        """The voice a multipart upload registers, checked as vLLM-Omni checks it."""
        missing = [f for f in ("consent", "name") if not isinstance(form.get(f), str)]
        if missing:
            raise validation_failure(
                [{"type": "missing", "loc": (f,), "msg": "Field required"} for f in missing]
            )
        sample, embedding = form.get("audio_sample"), form.get("speaker_embedding")
        if sample is not None and embedding is not None:
            raise BadRequest("'audio_sample' and 'speaker_embedding' are mutually exclusive")
        if embedding is not None:
            raise BadRequest("speaker_embedding uploads are not supported by this fake; send audio_sample")
        if not isinstance(sample, web.FileField):
            raise BadRequest("Either 'audio_sample' or 'speaker_embedding' must be provided")
        name, consent = form["name"].strip(), form["consent"]
        if not name or name in (".", "..") or any(c in name for c in "/\\\x00"):
            raise BadRequest(
                f"Invalid voice name {form['name']!r}: must be non-empty, no path separators or NUL"
            )
        content = sample.file.read()
        if len(content) > UPLOAD_MAX_BYTES:
            raise BadRequest(f"File size exceeds maximum limit of 10MB. Got {len(content)} bytes.")
        mime_type = sample.content_type
        if mime_type == "application/octet-stream":
            suffix = "." + sample.filename.lower().rpartition(".")[2]
            mime_type = UPLOAD_SUFFIX_MIME.get(suffix, "audio/wav")
        if mime_type not in UPLOAD_MIME_TYPES:
            raise BadRequest(f"Unsupported MIME type: {mime_type}. Allowed: {set(UPLOAD_MIME_TYPES)}")
        duration = self.sample_seconds(content)
        if not 1.0 <= duration <= 30.0:
            raise BadRequest(f"Reference audio of {duration:.1f}s: between 1s and 30s of speech is required.")
        key = name.lower()
        if key in PRESET_VOICES:
            raise BadRequest(
                f"Voice name '{name}' is reserved by a built-in speaker of this model; choose a different name."
            )
        if self.switches.registration_policy == "immutable" and key in self.uploaded:
            raise BadRequest(
                f"Voice '{name}' already exists and VLLM_OMNI_SPEAKER_REGISTRATION_POLICY is 'immutable'; "
                f"delete it first via DELETE /v1/audio/voices/{name}."
            )
        self.last_upload_ts = max(int(time.time()), self.last_upload_ts + 1)
        voice: dict[str, Any] = {
            "name": name,
            "consent": consent,
            "created_at": self.last_upload_ts,
            "mime_type": mime_type,
            "file_size": len(content),
        }
        for field in ("ref_text", "speaker_description"):
            value = form.get(field)
            if isinstance(value, str) and value.strip():
                voice[field] = value.strip()
        self.uploaded[key] = voice
        return voice

    @staticmethod
    def sample_seconds(content: bytes) -> float:
        import soundfile

        try:
            info = soundfile.info(io.BytesIO(content))
        except Exception as exc:  # soundfile raises its own error types, and RuntimeError
            raise BadRequest(f"Could not decode audio file: {exc}") from None
        return float(info.frames) / info.samplerate if info.samplerate else 0.0

    async def delete_voice(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.switches.fail_voice_deletes:
            return error_response(500, "Voice deletion failed: injected failure", "InternalServerError")
        if self.uploaded.pop(name.lower(), None) is None:
            return error_response(404, f"Voice '{name}' not found", "NotFoundError")
        return web.json_response({"success": True, "message": f"Voice '{name}' deleted successfully"})

    # -- for the tests ----------------------------------------------------------------------------

    async def get_control(self, request: web.Request) -> web.Response:
        return web.json_response(self.switches.model_dump())

    async def set_control(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
            self.switches = Switches.model_validate({**self.switches.model_dump(), **changes})
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            return error_response(400, str(exc), "Bad Request")
        logger.info("switches changed: %s", changes)
        return web.json_response(self.switches.model_dump())

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests_total": self.requests_total,
                "in_flight": self.in_flight,
                "requests": [dataclasses.asdict(r) for r in self.records],
            }
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--replica", default="upstream", help="echoed in X-Upstream-Replica")
    parser.add_argument("--model", default="cosyvoice3", help="the one model /v1/models lists")
    parser.add_argument("--api-key", default=None, help="required as a Bearer token on /v1/*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    get_lib()  # eSpeak is loaded before the port opens: /health answering means speech can be made
    server = FakeVllmOmni(model=args.model, replica=args.replica, api_key=args.api_key)
    logger.info("fake vLLM-Omni %r (model %s) on %s:%d", args.replica, args.model, args.host, args.port)
    # run_app stops on SIGTERM (and SIGINT); shutdown_timeout bounds the wait for hung handlers.
    web.run_app(
        server.app(),
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        print=None,
    )


if __name__ == "__main__":
    main()
