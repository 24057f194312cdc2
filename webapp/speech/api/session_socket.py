"""``WS /v1/audio/speech/stream``: a realtime session. Text in as it is written, audio out per unit.

The protocol is a superset of vLLM-Omni's streaming-text socket at the same path (docs/api.md,
"Realtime sessions"): the client configures the session (``session.config``), sends text
(``input.text``) and flushes (``input.done``); the server answers each speakable unit with
``audio.start``, binary audio frames and ``audio.done``, and each flush with ``session.done``.
Ours besides, as events and fields such a client ignores: ``input.clear`` (barge-in), several
``context_id``\\ s per socket, a ``timestamps`` event per unit, the characters charged per unit and
flush, ``session.ready``/``input.cleared``/``session.closed``, an idle timeout and pings.

Where the work runs: every unit is a job (``SynthesisJob.session``) submitted through the one
submit path (limits, quota, dictionaries, the sentence cache) and rendered by a worker under the
job machinery; this process only cuts text (synth.units), submits, and relays the unit's stream
file to the socket as ``JobStream`` does for HTTP (a worker killed mid-unit: the unit is claimed
again and its audio continues from the byte it had reached). Each unit is settled through the
ledger's delivery call (``lifecycle.report_handed``): whole once all of its audio left, what left
when the client clears it or goes away; units cleared before any audio left cost nothing.

Units are sent one after another in the order they were cut, across contexts: a binary frame
belongs to the last ``audio.start`` (as in vLLM-Omni's protocol). Up to ``UNITS_AHEAD`` units
are submitted ahead of the one being sent, so workers render the next while this one plays.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections
from rest_framework.exceptions import ValidationError

from synth.registry import G711_FORMATS, RATES_BY_FORMAT
from synth.units import CutPolicy, Unit, UnitCutter
from webapp.client_ip import ip_from_scope
from webapp.errors import DomainError, ErrorCode
from webapp.problems import as_problem
from webapp.speech import lifecycle, sessions, submission
from webapp.speech.api.stream_wakeups import AsyncWakeups
from webapp.speech.api.streaming import JobStream as _JobStream
from webapp.speech.api.streaming import LiveEncoder, StreamBroken
from webapp.speech.models import JobTimestamps, SpeechSession, SynthesisJob
from webapp.speech.requests import SpeechRequestSerializer
from webapp.speech.services import lanes
from webapp.speech.services.ledger import reports
from webapp.tenants import roles
from webapp.tenants.auth import Credential, authenticate_handshake, protocol_to_echo
from webapp.tenants.models import ApiKey
from webapp.tenants.services import find_api_key, key_role

log = logging.getLogger(__name__)

SESSION_PATH = "/v1/audio/speech/stream"
WAIT_SENT_EXTENSION = "tts.wait_sent"  # deploy/asgi_worker.py offers both
DRAINING_EXTENSION = "tts.draining"
SCOPE = roles.Scope.SPEECH_WRITE.value

UNITS_AHEAD = 3  # units submitted beyond the one being sent
FRAME_SECONDS = 0.2  # audio per binary frame: what a clear can still let out is at most one frame
KEY_CHECK_SECONDS = 1.0  # a revoked key closes the session within this
DEFAULT_CONTEXT = "default"
MAX_CONTEXT_ID = 64
# Wire formats of a session (``response_format``) -> the encoder's name; units are rendered as PCM
# at the session's rate. ulaw and alaw are 8 kHz G.711 (a phone call's), so their rate is 8000.
WIRE_FORMATS = {"pcm": "pcm", "mp3": "mp3", "opus": "ogg", "ulaw": "ulaw", "alaw": "alaw"}
DEFAULT_RATE = 24000  # OpenAI's and vLLM-Omni's PCM rate
DEFAULT_RATES = {fmt: RATES_BY_FORMAT[WIRE_FORMATS[fmt]][0] for fmt in G711_FORMATS}  # 8000
# session.config fields passed to the job as they are (the native API's names); the rest are ours.
JOB_FIELDS = ("voice", "speed", "pitch", "volume", "language", "instructions", "seed", "cache", "loudness")
CONFIG_FIELDS = {
    "type",
    "model",
    "voice",
    "response_format",
    "sample_rate",
    "speed",
    "pitch",
    "volume",
    "language",
    "instructions",
    "seed",
    "cache",
    "loudness",
    "stream_audio",
    "timestamps",
    "first_unit_chars",
    "unit_chars",
    "task_type",
}


class Gone(Exception):
    """The client's connection is closed: nothing more can be sent."""


class Close(Exception):
    """End the session with this close code and reason (the ErrorCode, or a word)."""

    def __init__(self, code: int, reason: str, message: str = "") -> None:
        super().__init__(reason)
        self.code, self.reason, self.message = code, reason, message

    @classmethod
    def of(cls, error: Exception) -> Close:
        problem = as_problem(error)
        if problem is None:
            return cls(1011, "server_error")
        return cls(4000 + problem.status, problem.code, problem.message)


def error_event(error: Exception, **more: Any) -> dict[str, Any]:
    problem = as_problem(error)
    if problem is None:
        return {"type": "error", "code": "server_error", "message": "Internal error.", **more}
    event = {"type": "error", "code": problem.code, "status": problem.status, "message": problem.message}
    if problem.field:
        event["param"] = problem.field
    return {**event, **more}


def _db(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``fn`` in the session's own thread, its database connection given back to the pool after."""

    def call(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(call)


# --------------------------------------------------------------------- the socket


class Socket:
    """The ASGI WebSocket connection: sends that fail once the client is gone, and the server's
    wait until what was sent left the process (``tts.wait_sent``).

    This class speaks the native protocol; a dialect (api/dialects.py) is a subclass that
    translates each message on its way in and each event on its way out.
    """

    protocol = "native"  # the dialect, as the session's row records it

    def __init__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        self.scope, self._receive, self._send = scope, receive, send
        extensions = scope.get("extensions") or {}
        self._wait_sent = extensions.get(WAIT_SENT_EXTENSION)
        draining = extensions.get(DRAINING_EXTENSION)
        self.draining: asyncio.Event = draining if isinstance(draining, asyncio.Event) else asyncio.Event()
        self.gone = False
        # Why the connection went without a close frame, for the session's row (it cannot be sent).
        self.gone_reason = "client_gone"
        self.gone_code = 1006  # closed with no close frame (recorded only; never sent)
        self.accepted = False
        self.closed = False

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.scope.get("headers") or []}

    async def receive(self) -> dict[str, Any]:
        message = cast(dict[str, Any], await self._receive())
        if message["type"] == "websocket.disconnect":
            self.gone = True
            if not self.closed:
                self.gone_code, self.gone_reason = int(message.get("code") or 1005), "client_closed"
        return message

    async def _out(self, message: dict[str, Any]) -> None:
        if self.gone or self.closed:
            raise Gone()
        timeout = float(settings.TTS_SESSION_SEND_TIMEOUT_SECONDS)
        try:
            async with asyncio.timeout(timeout):
                await self._send(message)
        except TimeoutError:
            # The client takes nothing: returning from the app drops the connection.
            self.gone, self.gone_reason = True, "client_not_reading"
            raise Gone() from None
        except OSError:
            self.gone = True
            raise Gone() from None
        except Exception as exc:  # uvicorn's ClientDisconnected, Starlette-free
            if type(exc).__name__ == "ClientDisconnected":
                self.gone = True
                raise Gone() from None
            raise

    async def accept(self, subprotocol: str | None = None) -> None:
        message: dict[str, Any] = {"type": "websocket.accept"}
        if subprotocol:
            message["subprotocol"] = subprotocol
        await self._out(message)
        self.accepted = True

    async def send_json(self, event: dict[str, Any]) -> None:
        await self._out({"type": "websocket.send", "text": json.dumps(event, separators=(",", ":"))})

    async def send_bytes(self, data: bytes) -> bool:
        """Send an audio frame and wait until it left the process: False when the client is gone first."""
        return await self._send_and_wait({"type": "websocket.send", "bytes": data})

    async def _send_and_wait(self, message: dict[str, Any]) -> bool:
        await self._out(message)
        if self._wait_sent is None:
            return True
        try:
            async with asyncio.timeout(float(settings.TTS_SESSION_SEND_TIMEOUT_SECONDS)):
                left = bool(await self._wait_sent())
        except TimeoutError:
            self.gone, self.gone_reason = True, "client_not_reading"
            raise Gone() from None
        if not left:
            self.gone = True
        return left

    async def close(self, code: int, reason: str = "", message: str = "") -> None:
        """The close frame; ``message``: what a dialect may say in its own error shape first."""
        if self.closed or self.gone:
            return
        with contextlib.suppress(Gone):
            if not self.accepted:
                await self.accept()  # a close code reaches the client only after the handshake
            await self._out(
                {
                    "type": "websocket.close",
                    "code": code,
                    "reason": reason.encode()[:123].decode("utf-8", "ignore"),
                }
            )
        self.closed = True


# --------------------------------------------------------------------- a unit's audio


class Transcoder:
    """PCM of the session's rate into its wire format (each unit its own stream for mp3/opus; G.711
    companded sample by sample, the units rendered at its 8 kHz already)."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.format, self.rate = fmt, rate
        self.encoder: LiveEncoder | None = None if fmt == "pcm" else LiveEncoder(WIRE_FORMATS[fmt], rate)

    def feed(self, pcm: bytes) -> bytes:
        return pcm if self.encoder is None else self.encoder.feed(pcm)

    def finish(self) -> bytes:
        return b"" if self.encoder is None else self.encoder.finish()


class UnitStream(_JobStream):
    """One unit's job as the session sends it: PCM from its stream file (or its stored PCM when it
    finished before its turn) through the session's transcoder, in frames of ``FRAME_SECONDS``.

    A worker that dies mid-unit: the job is claimed again and its new attempt renders the unit
    afresh; the stream skips what the lost attempt had already given out and continues, so the
    client hears the unit once (a seed makes the two attempts' audio the same; without one the
    join may be audible). The session renews every unit's waiter lease at once, so this stream
    renews none of its own.
    """

    def __init__(self, job_id: Any, transcoder: Transcoder, rate: int, wait_sent: Any) -> None:
        super().__init__(job_id, "pcm", abandon_on_close=True, wait_sent=wait_sent)
        self.transcoder = transcoder
        self.block = max(2, int(rate * FRAME_SECONDS) * 2)
        self.next_lease_renewal = math.inf
        self.skip = 0
        self.restarts = 0
        self.stored_pcm = 0

    def _keep_lease(self) -> None:  # type: ignore[override]
        return None

    def step(self, row_changed: bool = False) -> bytes:
        if self.skip and self.reader is not None:
            self.backlog += self.reader.read()
            dropped = min(self.skip, len(self.backlog))
            self.backlog, self.skip = self.backlog[dropped:], self.skip - dropped
            if self.reader.ended:
                self.skip = 0  # the new attempt came out shorter: what it has past the old one is all
            if self.skip:
                return b""
        return super().step(row_changed)

    def _live(self, pcm: bytes) -> bytes:
        self.read_pcm += len(pcm)
        self.unhanded += len(pcm)
        return self.transcoder.feed(pcm)

    def _stored_block(self) -> bytes:
        assert self.stored is not None
        if self.skip:
            self.stored.seek(self.skip)
            self.stored_pcm, self.skip = self.skip, 0
        block = self.stored.read(self.block)
        if not block:
            self.done = True
            self.close()
            return self.transcoder.finish()
        self.stored_pcm += len(block)
        return self.transcoder.feed(block)

    def _check_attempt(self) -> bytes:
        try:
            out = super()._check_attempt()
        except StreamBroken:
            row = self._row()
            if row is None or row["status"] not in SynthesisJob.ACTIVE or self.restarts >= 3:
                raise
            # Claimed again (its worker died): the next attempt's audio, from where this one stopped.
            if self.reader is not None:
                self.reader.handle.close()
            self.reader, self.token = None, None
            self.skip, self.backlog = self.read_pcm, b""
            self.restarts += 1
            return b""
        if self.done:
            out += self.transcoder.finish()
        return out


# --------------------------------------------------------------------- the session


@dataclass
class Context:
    id: str
    cutter: UnitCutter
    offsets: list[int] = field(default_factory=list)  # session offset of each character of its text
    utterance: int = 0  # flushes so far
    sentences: int = 0  # units cut since the last flush
    audio_seconds: float = 0.0  # audio sent on this context (a unit's timestamps start from it)
    charged: dict[int, int] = field(default_factory=dict)  # characters charged per utterance


@dataclass
class UnitWork:
    context: Context
    unit: Unit
    utterance: int
    sentence: int
    session_start: int  # offsets of the unit's text in everything the client sent
    session_end: int
    job_id: Any = None
    cleared: asyncio.Event = field(default_factory=asyncio.Event)
    charged: int = 0


@dataclass
class Flush:
    context: Context
    utterance: int
    sentences: int


@dataclass
class Config:
    data: dict[str, Any]  # the job's fields, checked
    response_format: str
    sample_rate: int
    stream_audio: bool
    timestamps: bool
    voice: str
    policy: CutPolicy


async def _first_of(*waits: Awaitable[Any]) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()


class Session:
    """One socket's session, from the handshake to the close."""

    def __init__(self, socket: Socket) -> None:
        self.socket = socket
        self.key: ApiKey | None = None
        self.credential: Credential | None = None
        self.session: SpeechSession | None = None
        self.config: Config | None = None
        self.engine = ""  # the configured voice's engine (admission of new contexts)
        self.contexts: dict[str, Context] = {}
        self.closed_contexts: set[str] = set()
        self.queue: deque[UnitWork | Flush] = deque()
        self.queue_changed = asyncio.Event()
        self.submit_lock = asyncio.Lock()
        self.inflight: set[asyncio.Future[Any]] = set()
        self.received = 0  # characters received, all contexts
        self.units = 0
        self.context_count = 0
        self.audio_seconds = 0.0
        self.started = time.monotonic()
        self.last_activity = time.monotonic()
        self.messages: deque[float] = deque()
        self.current: UnitWork | None = None
        self.ending: Close | None = None
        self.closing_gracefully = False
        self.wake = asyncio.Event()

    # ----------------------------------------------------------------- open and close

    async def run(self) -> None:
        try:
            await self._open()
        except Close as close:
            await self.socket.close(close.code, close.reason, close.message)
            return
        tasks = [
            asyncio.create_task(self._read(), name="session-read"),
            asyncio.create_task(self._send_units(), name="session-send"),
            asyncio.create_task(self._watch(), name="session-watch"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if isinstance(exc, Close):
                    self.ending = self.ending or exc
                elif isinstance(exc, Gone):
                    self.ending = self.ending or Close(self.socket.gone_code, self.socket.gone_reason)
                elif exc is not None:
                    log.error("realtime session %s failed", self.session_id, exc_info=exc)
                    self.ending = self.ending or Close(1011, "server_error")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.shield(self._end())

    @property
    def buffered(self) -> int:
        """Characters received and not yet sent as audio: in a buffer, or in a unit still queued."""
        waiting = sum(c.cutter.waiting for c in self.contexts.values())
        return waiting + sum(
            i.unit.chars for i in self.queue if isinstance(i, UnitWork) and not i.cleared.is_set()
        )

    @property
    def session_id(self) -> Any:
        return self.session.id if self.session is not None else None

    async def _open(self) -> None:
        scope = self.socket.scope
        try:
            # Every key form, the Sec-WebSocket-Protocol ones included, through HTTP's failure budget:
            # 4401 for a wrong or malformed key, 4429 once the address has spent its budget.
            self.key, self.credential = await _db(authenticate_handshake)(
                self.socket.headers,
                (scope.get("query_string") or b"").decode("latin-1"),
                scope.get("subprotocols") or (),
                ip_from_scope(scope),
            )
            key = self.key
            if SCOPE not in (key.scopes or []) or not roles.role_allows(key_role(key), SCOPE):
                raise DomainError(ErrorCode.PERMISSION_DENIED, f"This API key lacks the {SCOPE!r} scope.")
            self.session = await _db(sessions.open_session)(key, self.socket.protocol)
        except DomainError as error:
            # A browser fails the handshake unless one of the protocols it offered comes back, and
            # reads a close code only after the handshake: a refusal echoes one too.
            with contextlib.suppress(Gone):
                await self.socket.accept(protocol_to_echo(scope.get("subprotocols") or ()))
            raise Close.of(error) from None
        await self.socket.accept(self.credential.subprotocol)

    async def _end(self) -> None:
        """Settle what is left, close the row, then the socket."""
        ending = self.ending or Close(1000, "closed")
        if self.inflight:
            await asyncio.gather(*self.inflight, return_exceptions=True)
        for item in list(self.queue):
            if isinstance(item, UnitWork) and item.job_id is not None:
                with contextlib.suppress(Exception):
                    await _db(lifecycle.report_handed)(item.job_id, handing=lifecycle.Handing.LEFT)
        self.queue.clear()
        if self.session is not None:
            totals = sessions.SessionTotals(
                contexts=self.context_count,
                units=self.units,
                received_chars=self.received,
                audio_seconds=self.audio_seconds,
            )
            closed = await _db(sessions.close_session)(self.session.id, ending.code, ending.reason, totals)
            if closed is not None and not self.socket.gone and ending.code in (1000, 1012):
                with contextlib.suppress(Gone):
                    await self.socket.send_json(
                        {
                            "type": "session.closed",
                            "session_id": str(closed.id),
                            "units": closed.units,
                            "charged_chars": closed.charged_chars,
                            "audio_seconds": closed.audio_seconds,
                        }
                    )
        await self.socket.close(ending.code, ending.reason, ending.message)

    # ----------------------------------------------------------------- reading

    async def _read(self) -> None:
        idle = float(settings.TTS_SESSION_IDLE_SECONDS)
        while True:
            try:
                async with asyncio.timeout(idle if self.config is None else None):
                    message = await self.socket.receive()
            except TimeoutError:
                raise Close(4400, ErrorCode.INVALID_REQUEST.value, "no session.config came") from None
            if message["type"] == "websocket.disconnect":
                raise Gone()
            self.last_activity = time.monotonic()
            self._count_message()
            if message.get("bytes") is not None:
                await self._refuse(
                    DomainError(
                        ErrorCode.INVALID_REQUEST, "Binary frames are not accepted; send JSON text messages."
                    )
                )
                continue
            try:
                event = json.loads(message.get("text") or "")
            except ValueError:
                event = None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                error = DomainError(
                    ErrorCode.INVALID_REQUEST, 'Each message must be a JSON object with a "type".'
                )
                if self.config is None:
                    raise Close.of(error)
                await self._refuse(error)
                continue
            await self._handle(event)

    def _count_message(self) -> None:
        now = time.monotonic()
        self.messages.append(now)
        while self.messages and self.messages[0] < now - 1.0:
            self.messages.popleft()
        limit = int(settings.TTS_SESSION_MESSAGES_PER_SECOND)
        if len(self.messages) > limit:
            raise Close(4429, ErrorCode.SESSION_LIMIT.value, f"more than {limit} messages a second")

    async def _refuse(self, error: Exception, **more: Any) -> None:
        await self.socket.send_json(error_event(error, **more))

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if self.config is None and kind != "session.config":
            raise Close.of(
                DomainError(ErrorCode.INVALID_REQUEST, "The first message must be a session.config.")
            )
        try:
            if kind == "session.config":
                await self._configure(event)
            elif kind == "input.text":
                await self._text(event)
            elif kind == "input.done":
                await self._flush(self._context(event))
            elif kind == "input.clear":
                await self._clear(self._context(event, create=False, closed=True))
            elif kind == "context.close":
                context = self._context(event, create=False)
                await self._flush(context)
                self.contexts.pop(context.id, None)
                self.closed_contexts.add(context.id)
            elif kind == "session.close":
                for context in list(self.contexts.values()):
                    if context.cutter.waiting:
                        await self._flush(context)
                self.closing_gracefully = True
                self._changed()
            elif kind == "ping":
                await self.socket.send_json({"type": "pong"})
            else:
                raise DomainError(ErrorCode.INVALID_REQUEST, f"Unknown message type {kind[:40]!r}.")
        except (DomainError, ValidationError) as error:
            if self.config is None:
                raise Close.of(error) from None
            await self._refuse(
                error,
                **({"context_id": event["context_id"]} if isinstance(event.get("context_id"), str) else {}),
            )

    def _changed(self) -> None:
        self.queue_changed.set()

    # ----------------------------------------------------------------- configuration

    async def _configure(self, event: dict[str, Any]) -> None:
        if self.buffered:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                "A session.config while text is waiting would change how it is spoken; send input.done "
                "and wait for session.done first.",
            )
        unknown = sorted(set(event) - CONFIG_FIELDS)
        if unknown:
            raise DomainError(
                ErrorCode.INVALID_REQUEST, f"Unknown session.config field {unknown[0]!r}.", field=unknown[0]
            )
        fmt = event.get("response_format", "pcm")
        if not isinstance(fmt, str) or fmt not in WIRE_FORMATS:  # (a list is no key: a 400, not a crash)
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"response_format must be one of {', '.join(WIRE_FORMATS)}.",
                field="response_format",
            )
        rate = event.get("sample_rate", DEFAULT_RATES.get(fmt, DEFAULT_RATE))
        allowed = RATES_BY_FORMAT[WIRE_FORMATS[fmt]]
        if not isinstance(rate, int) or isinstance(rate, bool) or rate not in allowed:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"sample_rate {rate!r} is not available for {fmt}; use one of {', '.join(map(str, allowed))}.",
                field="sample_rate",
            )
        for flag in ("stream_audio", "timestamps"):
            if flag in event and not isinstance(event[flag], bool):
                raise DomainError(ErrorCode.INVALID_REQUEST, f"{flag} must be true or false.", field=flag)
        policy = CutPolicy()
        for name, attr in (("first_unit_chars", "first_clause_chars"), ("unit_chars", "clause_chars")):
            if name in event:
                value = event[name]
                if (
                    not isinstance(value, int)
                    or isinstance(value, bool)
                    or not 1 <= value <= policy.max_chars
                ):
                    raise DomainError(
                        ErrorCode.INVALID_REQUEST, f"{name} must be 1 - {policy.max_chars}.", field=name
                    )
                policy = dataclasses.replace(policy, **{attr: value})
        data: dict[str, Any] = {k: event[k] for k in JOB_FIELDS if k in event}
        model = event.get("model")
        if isinstance(model, str) and model and model not in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"):
            data["engine"] = model
        data["format"], data["sample_rate"] = "pcm", rate
        assert self.key is not None
        # The whole job request is checked now (voice, model, rate, controls): a unit later fails only
        # for what changed meanwhile (a limit reached, a voice deleted).
        checked = await _db(self._check_job)(dict(data, text="Hello."), True)
        # A full interactive lane refuses the session now (4429) rather than serving it late.
        engine = await _db(submission.engine_of)(checked)
        await _db(lanes.admit)(engine)
        self.engine = engine
        timestamps = (
            event.get("timestamps", True)
            and (checked.voice.capabilities or {}).get("timestamps") is not False
        )
        self.config = Config(
            data=data,
            response_format=fmt,
            sample_rate=rate,
            stream_audio=bool(event.get("stream_audio", True)),
            timestamps=bool(timestamps),
            voice=checked.voice.voice_id,
            policy=policy,
        )
        for context in self.contexts.values():
            context.cutter.policy = policy
        assert self.session is not None
        await _db(sessions.configured)(self.session.id, checked.voice.voice_id, fmt)
        await self.socket.send_json(
            {
                "type": "session.ready",
                "session_id": str(self.session.id),
                "voice": checked.voice.voice_id,
                "format": fmt,
                "sample_rate": rate,
                "timestamps": self.config.timestamps,
            }
        )

    def _check_job(self, data: dict[str, Any], first: bool = False) -> Any:
        assert self.key is not None
        serializer = SpeechRequestSerializer(
            data=data, context={"organization": self.key.organization, "source": "session"}
        )
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data["job"]

    # ----------------------------------------------------------------- text

    def _context(self, event: dict[str, Any], create: bool = True, closed: bool = False) -> Context:
        """The event's context; ``create``: a new id opens one; ``closed``: a closed one will do."""
        context_id = event.get("context_id", DEFAULT_CONTEXT)
        if not isinstance(context_id, str) or not 0 < len(context_id) <= MAX_CONTEXT_ID:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"context_id must be a string of 1 - {MAX_CONTEXT_ID} characters.",
                field="context_id",
            )
        context = self.contexts.get(context_id)
        if context is not None:
            return context
        if closed and context_id in self.closed_contexts:
            # No more text, but its audio still to come may be cleared (a barge-in).
            working = [
                i.context for i in [self.current, *self.queue] if i is not None and i.context.id == context_id
            ]
            if working:
                return working[0]
        if context_id in self.closed_contexts:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"Context {context_id!r} was closed; use a new context_id.",
                field="context_id",
            )
        if not create:
            raise DomainError(
                ErrorCode.INVALID_REQUEST, f"No context {context_id!r} is open.", field="context_id"
            )
        limit = int(settings.TTS_SESSION_CONTEXTS)
        if len(self.contexts) >= limit:
            raise DomainError(
                ErrorCode.SESSION_LIMIT,
                f"At most {limit} contexts may be open at once; close one (context.close).",
                field="context_id",
            )
        assert self.config is not None
        context = Context(context_id, UnitCutter(self.config.policy))
        self.contexts[context_id] = context
        self.context_count += 1
        return context

    async def _text(self, event: dict[str, Any]) -> None:
        text = event.get("text")
        if not isinstance(text, str):
            raise DomainError(ErrorCode.INVALID_REQUEST, "input.text needs a text string.", field="text")
        context_id = event.get("context_id", DEFAULT_CONTEXT)
        if (
            self.contexts
            and isinstance(context_id, str)
            and context_id not in self.contexts
            and context_id not in self.closed_contexts
        ):
            await _db(lanes.admit)(self.engine)  # a context beyond the first is new interactive work
        context = self._context(event)
        limit = int(settings.TTS_SESSION_BUFFER_CHARS)
        if self.buffered + len(text) > limit:
            raise DomainError(
                ErrorCode.SESSION_LIMIT,
                f"This text would make {self.buffered + len(text):,} characters wait in the session; at most "
                f"{limit:,}. Nothing of it was taken: send it again once audio has gone out.",
                field="text",
            )
        base = self.received
        context.offsets.extend(range(base, base + len(text)))
        self.received += len(text)
        self._queue_units(context, context.cutter.add(text))
        if event.get("flush") is True:
            await self._flush(context)
        await self._submit_ahead()

    def _queue_units(self, context: Context, units: list[Unit]) -> None:
        for unit in units:
            start = context.offsets[unit.start] if unit.start < len(context.offsets) else self.received
            end = context.offsets[unit.end - 1] + 1 if unit.end - 1 < len(context.offsets) else self.received
            self.queue.append(UnitWork(context, unit, context.utterance, context.sentences, start, end))
            context.sentences += 1
            self.units += 1
        self._changed()

    async def _flush(self, context: Context) -> None:
        units = context.cutter.flush()
        self._queue_units(context, units)
        self.queue.append(Flush(context, context.utterance, context.sentences))
        context.utterance += 1
        context.sentences = 0
        self._changed()
        await self._submit_ahead()

    async def _clear(self, context: Context) -> None:
        dropped = context.cutter.clear()
        canceled: list[UnitWork] = []
        for item in list(self.queue):
            if item.context is not context:
                continue
            self.queue.remove(item)
            if isinstance(item, UnitWork):
                item.cleared.set()
                dropped += item.unit.chars if item is not self.current else 0
                canceled.append(item)
        context.utterance += 1
        context.sentences = 0
        # Queued units end now, nothing charged; the one being sent is settled by its sender.
        for item in canceled:
            if item.job_id is not None and item is not self.current:
                await _db(lifecycle.report_handed)(item.job_id, handing=lifecycle.Handing.LEFT)
        await self.socket.send_json(
            {
                "type": "input.cleared",
                "context_id": context.id,
                "dropped_chars": dropped,
                "canceled_units": len(canceled),
            }
        )
        self._changed()
        await self._submit_ahead()

    # ----------------------------------------------------------------- submitting units

    async def _submit_ahead(self) -> None:
        async with self.submit_lock:
            ahead = 0
            for item in list(self.queue):
                if ahead > UNITS_AHEAD:
                    break
                if not isinstance(item, UnitWork) or item.cleared.is_set():
                    continue
                ahead += 1
                if item.job_id is None:
                    if not await self._submit(item, head=item is self.queue[0]):
                        break

    async def _submit(self, item: UnitWork, head: bool) -> bool:
        """Submit the unit's job; False when it must wait (the tenant's concurrency is full)."""
        assert self.config is not None and self.key is not None and self.session is not None
        data = dict(self.config.data, text=item.unit.text)
        # A submit runs to its end even if the session ends meanwhile (its thread cannot be stopped):
        # the job it makes is named on the unit by the callback, and _end settles it.
        submitting = asyncio.ensure_future(_db(self._submit_job)(data))
        self.inflight.add(submitting)
        submitting.add_done_callback(self.inflight.discard)
        submitting.add_done_callback(
            lambda task: (
                setattr(item, "job_id", task.result())
                if not task.cancelled() and task.exception() is None
                else None
            )
        )
        try:
            await asyncio.shield(submitting)
            return True
        except DomainError as error:
            if error.code in (ErrorCode.CONCURRENCY_LIMIT, ErrorCode.QUEUE_FULL) and not head:
                return False
            if error.code in (ErrorCode.QUOTA_EXCEEDED, ErrorCode.KEY_QUOTA_EXCEEDED):
                raise Close.of(error) from None
            raise

    def _submit_job(self, data: dict[str, Any]) -> Any:
        request = self._check_job(data)
        assert self.key is not None and self.session is not None
        request = dataclasses.replace(
            request, session_id=self.session.id, waited=True, source="session", lane="interactive"
        )
        job, _ = submission.submit(self.key.organization, request, api_key=self.key, user=self.key.user)
        return job.id

    # ----------------------------------------------------------------- sending

    async def _send_units(self) -> None:
        while True:
            if self.socket.draining.is_set() or (self.closing_gracefully and not self.queue):
                raise Close(
                    1012 if self.socket.draining.is_set() else 1000,
                    "server_restart" if self.socket.draining.is_set() else "closed",
                )
            if not self.queue:
                self.queue_changed.clear()
                # An idle session hears the server's drain too: it closes 1012 at once, not when
                # gunicorn's graceful timeout cuts it off.
                await _first_of(self.queue_changed.wait(), self.socket.draining.wait())
                continue
            item = self.queue[0]
            if isinstance(item, Flush):
                self.queue.popleft()
                await self.socket.send_json(
                    {
                        "type": "session.done",
                        "utterance_index": item.utterance,
                        "total_sentences": item.sentences,
                        "context_id": item.context.id,
                        "charged_chars": item.context.charged.pop(item.utterance, 0),
                        "session_charged_chars": self.charged_so_far,
                    }
                )
                continue
            await self._send_unit(item)
            if self.queue and self.queue[0] is item:
                self.queue.popleft()
            # Idle counts from the last audio too: a long answer's session is not closed the moment
            # it ends because its text came in more than TTS_SESSION_IDLE_SECONDS before.
            self.last_activity = time.monotonic()
            await self._submit_ahead()

    charged_so_far = 0

    async def _send_unit(self, item: UnitWork) -> None:
        """Submit (at its turn, waiting out a full tenant), then relay the unit's audio."""
        assert self.config is not None
        while item.job_id is None and not item.cleared.is_set():
            try:
                async with self.submit_lock:  # (_submit_ahead may be submitting it right now)
                    if item.job_id is not None or await self._submit(item, head=True):
                        break
            except DomainError as error:
                if error.code in (ErrorCode.CONCURRENCY_LIMIT, ErrorCode.QUEUE_FULL):
                    await asyncio.sleep(0.2)
                    continue
                await self._unit_failed(item, error)
                return
        if item.cleared.is_set():
            return
        self.current = item
        try:
            await self._relay(item)
        finally:
            self.current = None

    async def _unit_failed(self, item: UnitWork, error: Exception) -> None:
        await self.socket.send_json(
            error_event(error, context_id=item.context.id, sentence_index=item.sentence)
        )
        await self.socket.send_json(self._done_event(item, 0, error=True))

    def _done_event(
        self, item: UnitWork, total_bytes: int, error: bool = False, cleared: bool = False
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "audio.done",
            "utterance_index": item.utterance,
            "sentence_index": item.sentence,
            "total_bytes": total_bytes,
            "error": error,
            "context_id": item.context.id,
            "charged_chars": item.charged,
        }
        if cleared:
            event["cleared"] = True
        return event

    async def _relay(self, item: UnitWork) -> None:
        assert self.config is not None
        config = self.config
        transcoder = Transcoder(config.response_format, config.sample_rate)
        stream = UnitStream(item.job_id, transcoder, config.sample_rate, None)
        wakeups = await AsyncWakeups(item.job_id).open()
        started = False
        sent_bytes = 0
        held = b""  # stream_audio false: the unit's audio in one frame at its end
        timestamps_sent = 0
        ended = "left"
        step = sync_to_async(stream.step)
        try:
            while not stream.done:
                if item.cleared.is_set():
                    break
                stream.row_check_seconds = wakeups.row_check_seconds
                try:
                    chunk = await step(wakeups.take_row_changed())
                except StreamBroken:
                    ended = "broken"
                    break
                if chunk:
                    if not started:
                        started = True
                        await self.socket.send_json(self._start_event(item))
                    if config.stream_audio:
                        if item.cleared.is_set():
                            break
                        if not await self.socket.send_bytes(chunk):
                            break
                        sent_bytes += len(chunk)
                        stream.handed()
                    else:
                        held += chunk
                    timestamps_sent = await self._send_timestamps(item, stream, timestamps_sent)
                elif not stream.done:
                    await self._wait(wakeups, item)
            else:
                ended = "whole"
            if ended == "whole" and held:
                if item.cleared.is_set() or not await self.socket.send_bytes(held):
                    ended = "left"
                else:
                    sent_bytes += len(held)
                    stream.handed()
        finally:
            await wakeups.close()
            if ended == "whole":
                await _db(stream.handed_to_the_end)()
            else:
                await _db(stream.give_up)()
        self.audio_seconds += stream.delivered / 2 / config.sample_rate
        item.context.audio_seconds += stream.delivered / 2 / config.sample_rate
        item.charged = await _db(reports.job_charge)(item.job_id)
        self.charged_so_far += item.charged
        item.context.charged[item.utterance] = item.context.charged.get(item.utterance, 0) + item.charged
        if ended == "whole":
            await self._stored_timestamps(item, timestamps_sent)
        if ended == "broken":
            failure = await _db(_failure_of)(item.job_id)
            await self.socket.send_json(
                {
                    "type": "error",
                    "code": failure[0] or "job_failed",
                    "message": failure[1] or "The unit could not be synthesised.",
                    "context_id": item.context.id,
                    "sentence_index": item.sentence,
                }
            )
        if not started and ended != "whole":
            await self.socket.send_json(self._start_event(item))
        if not self.socket.gone:
            await self.socket.send_json(
                self._done_event(item, sent_bytes, error=ended == "broken", cleared=item.cleared.is_set())
            )

    def _start_event(self, item: UnitWork) -> dict[str, Any]:
        assert self.config is not None
        return {
            "type": "audio.start",
            "utterance_index": item.utterance,
            "sentence_index": item.sentence,
            "sentence_text": item.unit.text,
            "format": self.config.response_format,
            "sample_rate": self.config.sample_rate,
            "context_id": item.context.id,
            "unit_id": str(item.job_id),
            "text_start": item.session_start,
            "text_end": item.session_end,
        }

    async def _wait(self, wakeups: AsyncWakeups, item: UnitWork) -> None:
        """Until the unit's job says something, or the unit is cleared."""
        await _first_of(wakeups.wait(), item.cleared.wait())

    async def _send_timestamps(self, item: UnitWork, stream: UnitStream, sent: int) -> int:
        if not self.config or not self.config.timestamps or stream.reader is None:
            return sent
        for at, event in stream.reader.timestamps[sent:]:
            if at > stream.read_pcm:
                break
            await self.socket.send_json(self._timestamps_event(item, event.get("words") or []))
            sent += 1
        return sent

    async def _stored_timestamps(self, item: UnitWork, sent: int) -> None:
        if not self.config or not self.config.timestamps or sent:
            return
        row = await _db(lambda: JobTimestamps.objects.filter(job_id=item.job_id).values("words").first())()
        if row is not None and row["words"]:
            await self.socket.send_json(self._timestamps_event(item, row["words"]))

    def _timestamps_event(self, item: UnitWork, words: list[dict[str, Any]]) -> dict[str, Any]:
        """A unit's words, their characters placed in everything the client sent this session."""
        offsets = item.context.offsets
        placed = []
        for word in words:
            start = item.unit.start + int(word.get("char_start", 0))
            end = item.unit.start + int(word.get("char_end", 0))
            if not (0 <= start < len(offsets) and 0 < end <= len(offsets)):
                continue
            placed.append(
                {
                    "text": word.get("text", ""),
                    "start": word.get("start"),
                    "end": word.get("end"),
                    "char_start": offsets[start],
                    "char_end": offsets[end - 1] + 1,
                }
            )
        return {
            "type": "timestamps",
            "context_id": item.context.id,
            "utterance_index": item.utterance,
            "sentence_index": item.sentence,
            "unit_id": str(item.job_id),
            "audio_offset": round(item.context.audio_seconds, 4),
            "words": placed,
        }

    # ----------------------------------------------------------------- watching

    async def _watch(self) -> None:
        """Pings, idle and length limits, the key's revocation, leases and the row's liveness."""
        max_seconds = float(settings.TTS_SESSION_MAX_SECONDS)
        idle = float(settings.TTS_SESSION_IDLE_SECONDS)
        lease_every = settings.TTS_WAITER_LEASE_SECONDS / 3
        alive_every = sessions.ALIVE_SECONDS / 3
        next_lease = next_alive = time.monotonic()
        while True:
            await asyncio.sleep(KEY_CHECK_SECONDS)
            now = time.monotonic()
            if now - self.started > max_seconds:
                raise Close(
                    4429, ErrorCode.SESSION_LIMIT.value, f"sessions last at most {int(max_seconds)} s"
                )
            if not self.queue and self.current is None and now - self.last_activity > idle:
                raise Close(1000, "idle")
            if self.credential is not None and await _db(find_api_key)(self.credential.token) is None:
                raise Close(4401, ErrorCode.UNAUTHENTICATED.value, "the API key was revoked")
            if now >= next_lease:
                next_lease = now + lease_every
                await _db(lifecycle.renew_session_waiters)(self.session_id)
            if now >= next_alive:
                next_alive = now + alive_every
                if not await _db(sessions.keep_alive)(self.session_id):
                    raise Close(1011, "session_closed")


def _failure_of(job_id: Any) -> tuple[str, str]:
    row = SynthesisJob.objects.filter(pk=job_id).values_list("error_code", "error_message").first()
    return (row[0], row[1]) if row else ("", "")


__all__ = ["SESSION_PATH", "Close", "Session", "Socket", "error_event"]
