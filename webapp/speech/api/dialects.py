"""Agents' dialects on the session core: ElevenLabs' and Deepgram's streaming WebSockets.

Most voice-agent code is written against ElevenLabs' ``stream-input`` / ``multi-stream-input``
sockets or Deepgram's ``/v1/speak``; speaking them lets an agent move here by changing a URL and
a key. Each dialect is a :class:`Socket` that translates: every message the client sends becomes
the native events it means (``session.config``, ``input.text``, ``input.done``, ``input.clear``,
``context.close``, ``session.close``), and every event the session sends becomes the dialect's
own message, or nothing. The session itself (api/session_socket.py) is the same for all: one
submit path, the interactive lane, billing per unit, limits, and one error mapping, whose
problems each dialect words in its own shape.

What each supports and what it ignores is in docs/api.md ("ElevenLabs' streaming dialect",
"Deepgram's streaming dialect").
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote

from webapp.errors import DomainError, ErrorCode
from webapp.speech.api.session_socket import SESSION_PATH, Close, Gone, Socket, error_event

# ----------------------------------------------------------------------------- ElevenLabs

ELEVENLABS_PATH = re.compile(
    r"^/v1/text-to-speech/(?P<voice>[^/]+)/(?P<kind>stream-input|multi-stream-input)$"
)
# ElevenLabs' output_format names -> the session's (response_format, sample_rate).
ELEVENLABS_FORMATS = {
    "pcm_16000": ("pcm", 16000),
    "pcm_22050": ("pcm", 22050),
    "pcm_24000": ("pcm", 24000),
    "pcm_44100": ("pcm", 44100),
    "ulaw_8000": ("ulaw", 8000),
    "alaw_8000": ("alaw", 8000),
    "mp3_44100_128": ("mp3", 44100),
}
ELEVENLABS_DEFAULT_FORMAT = "mp3_44100_128"  # theirs
ELEVENLABS_DEFAULT_CONTEXT = "default"
# chunk_length_schedule's items are 50-500 characters there; a unit here is at most this long.
MAX_SCHEDULE_CHARS = 250

# ----------------------------------------------------------------------------- Deepgram

DEEPGRAM_PATH = "/v1/speak"
DEEPGRAM_ENCODINGS = {"linear16": "pcm", "mulaw": "ulaw", "alaw": "alaw"}
DEEPGRAM_DEFAULT_RATES = {"linear16": 24000, "mulaw": 8000, "alaw": 8000}


def _invalid(message: str, field: str | None = None) -> DomainError:
    return DomainError(ErrorCode.INVALID_REQUEST, message, field=field)


class DialectSocket(Socket):
    """A socket that speaks another service's protocol to the client and the native one to the session."""

    def __init__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        super().__init__(scope, receive, send)
        self.pending: deque[dict[str, Any]] = deque()  # native events for the session, in order
        self.query = {
            k: v[-1] for k, v in parse_qs((scope.get("query_string") or b"").decode("latin-1")).items()
        }
        self.ready = False  # the session answered its config
        # What the URL asks cannot be served: the first receive says so.
        self.refusal: DomainError | None = None
        self.setup()

    def setup(self) -> None:
        """The dialect's own state, from the scope (its path and its query)."""

    # ----------------------------------------------------------------- in

    async def receive(self) -> dict[str, Any]:
        if self.refusal is not None and self.accepted:
            raise Close.of(self.refusal)
        while not self.pending:
            message = await super().receive()
            if message["type"] != "websocket.receive":
                return message
            try:
                # A message that asks for nothing (ElevenLabs' keepalive) is a ping to the session:
                # it keeps the session from idling out and counts against its message rate.
                self.pending.extend(self.translate(message) or [{"type": "ping"}])
            except DomainError as error:
                if not self.ready:
                    raise Close.of(error) from None
                await self.send_json(error_event(error))
                self.pending.append({"type": "ping"})  # a refused message counts against the rate too
        return {"type": "websocket.receive", "text": json.dumps(self.pending.popleft())}

    def translate(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """The native events one client message means (DomainError: it means nothing valid)."""
        if message.get("bytes") is not None:
            raise _invalid("Binary frames are not accepted; send JSON text messages.")
        try:
            data = json.loads(message.get("text") or "")
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise _invalid("Each message must be a JSON object.")
        return self.events_of(data)

    def events_of(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    # ----------------------------------------------------------------- out

    async def send_json(self, event: dict[str, Any]) -> None:
        if event.get("type") == "session.ready":
            self.ready = True
        for message in self.messages_of(event):
            await self._send_text(message)

    async def _send_text(self, message: dict[str, Any]) -> None:
        await Socket.send_json(self, message)

    def messages_of(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError


class ElevenLabsSocket(DialectSocket):
    """``/v1/text-to-speech/{voice_id}/stream-input`` and ``.../multi-stream-input``.

    Audio goes out as base64 in JSON (``audio``), with ``alignment`` and ``normalizedAlignment``
    (characters, their start times and durations in ms, from the unit's word timestamps) in a
    message of their own; ``isFinal`` ends a context (multi) or the socket (single), which then
    closes 1000.
    """

    protocol = "elevenlabs"

    def setup(self) -> None:
        match = ELEVENLABS_PATH.match(str(self.scope.get("path") or ""))
        assert match is not None  # routed here by it (api/sockets.py)
        self.voice = unquote(match["voice"])
        self.multi = match["kind"] == "multi-stream-input"
        self.configured = False  # the first message (its config) is translated
        self.flushes: dict[str, int] = {}  # session.done events still to come, per context
        self.closing: set[str] = set()  # contexts closed by the client, their isFinal still owed
        self.open_contexts: set[str] = set()
        self.units: dict[str, dict[str, Any]] = {}  # audio.start of the unit being sent, per context
        self.current = ELEVENLABS_DEFAULT_CONTEXT

    def _config(self, data: dict[str, Any]) -> dict[str, Any]:
        name = self.query.get("output_format", ELEVENLABS_DEFAULT_FORMAT)
        if name not in ELEVENLABS_FORMATS:
            raise _invalid(
                f"output_format {name!r} is not served; use one of {', '.join(ELEVENLABS_FORMATS)}.",
                "output_format",
            )
        fmt, rate = ELEVENLABS_FORMATS[name]
        config: dict[str, Any] = {
            "type": "session.config",
            "voice": self.voice,
            "response_format": fmt,
            "sample_rate": rate,
            "timestamps": True,
        }
        settings = data.get("voice_settings")
        if isinstance(settings, dict) and settings.get("speed") is not None:
            config["speed"] = settings["speed"]
        generation = data.get("generation_config")
        schedule = generation.get("chunk_length_schedule") if isinstance(generation, dict) else None
        auto = self.query.get("auto_mode", "false").lower() == "true"  # their "no schedule, no buffer"
        if schedule is not None and not auto:
            if (
                not isinstance(schedule, list)
                or not schedule
                or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in schedule)
            ):
                raise _invalid(
                    "chunk_length_schedule must be a list of positive integers.", "chunk_length_schedule"
                )
            config["first_unit_chars"] = min(schedule[0], MAX_SCHEDULE_CHARS)
            config["unit_chars"] = min(schedule[1] if len(schedule) > 1 else schedule[0], MAX_SCHEDULE_CHARS)
        return config

    def events_of(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not self.configured:
            events.append(self._config(data))
            self.configured = True
        text = data.get("text")
        if text is not None and not isinstance(text, str):
            raise _invalid("text must be a string.", "text")
        context = (
            data.get("context_id", ELEVENLABS_DEFAULT_CONTEXT) if self.multi else ELEVENLABS_DEFAULT_CONTEXT
        )
        if not isinstance(context, str):
            raise _invalid("context_id must be a string.", "context_id")
        ours = {"context_id": context}
        if self.multi and data.get("close_socket") is True:
            return [*events, {"type": "session.close"}]
        if self.multi and data.get("close_context") is True:
            if context in self.closing:
                # Closed once already and its flushed audio still coming: closing it again drops
                # that too (an agent's barge-in after its turn was complete).
                return [*events, {"type": "input.clear", **ours}]
            if context not in self.open_contexts:
                raise _invalid(f"No context {context!r} is open.", "context_id")
            if not self.flushes.get(context):
                # Not set to flush: what it holds is dropped (a barge-in); a flush asked for goes on.
                events.append({"type": "input.clear", **ours})
            # The close flushes what is left: isFinal follows the context's last session.done.
            self.flushes[context] = self.flushes.get(context, 0) + 1
            self.closing.add(context)
            self.open_contexts.discard(context)
            return [*events, {"type": "context.close", **ours}]
        if text == "" and not data.get("flush"):
            # Single: the end of input (everything is spoken, isFinal, close 1000). Multi: a keepalive.
            return [*events, {"type": "session.close"}] if not self.multi else events
        flush = data.get("flush") is True
        if text:
            self.open_contexts.add(context)
            events.append({"type": "input.text", "text": text, "flush": flush, **ours})
        elif flush:
            events.append({"type": "input.done", **ours})
        if flush:
            self.flushes[context] = self.flushes.get(context, 0) + 1
        return events

    def messages_of(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        context = str(event.get("context_id") or ELEVENLABS_DEFAULT_CONTEXT)
        if kind == "audio.start":
            self.units[context] = event
            self.current = context
        elif kind == "timestamps":
            return [self._with_context({"audio": "", "isFinal": None, **self._alignment(event)}, context)]
        elif kind == "input.cleared" and context in self.closing:
            # A closing context's audio dropped: nothing more comes for it.
            self.flushes[context] = 0
            self.closing.discard(context)
            return [self._with_context({"isFinal": True}, context)]
        elif kind == "session.done":
            self.flushes[context] = max(0, self.flushes.get(context, 0) - 1)
            if context in self.closing and not self.flushes[context]:
                self.closing.discard(context)
                return [self._with_context({"isFinal": True}, context)]
        elif kind == "session.closed":
            if not self.multi:
                return [{"isFinal": True}]
            finals = [
                self._with_context({"isFinal": True}, c) for c in sorted(self.open_contexts | self.closing)
            ]
            self.open_contexts.clear()
            self.closing.clear()
            return finals
        elif kind == "error":
            problem = {"message": event.get("message", ""), "error": event.get("code", "error")}
            if "status" in event:
                problem["code"] = event["status"]
            if "context_id" in event:
                problem["contextId"] = event["context_id"]
            return [problem]
        # session.ready, audio.done, other input.cleared, pong: nothing in this dialect.
        return []

    def _with_context(self, message: dict[str, Any], context: str) -> dict[str, Any]:
        return {**message, "contextId": context} if self.multi else message

    def _alignment(self, event: dict[str, Any]) -> dict[str, Any]:
        """A unit's word timestamps as their character alignment, in ms from the unit's start."""
        unit = self.units.get(str(event.get("context_id") or ELEVENLABS_DEFAULT_CONTEXT)) or {}
        text = str(unit.get("sentence_text") or "")
        base = int(unit.get("text_start") or 0)
        starts = [0] * len(text)
        durations = [0] * len(text)
        clock = 0
        words = sorted(event.get("words") or [], key=lambda w: int(w.get("char_start", 0)))
        placed: dict[int, tuple[int, int]] = {}
        for word in words:
            first, last = int(word["char_start"]) - base, int(word["char_end"]) - base
            begin, end = (
                round(float(word.get("start") or 0) * 1000),
                round(float(word.get("end") or 0) * 1000),
            )
            span = max(1, last - first)
            for i in range(max(0, first), min(len(text), last)):
                placed[i] = (begin + (end - begin) * (i - first) // span, max(0, (end - begin) // span))
        for i in range(len(text)):
            if i in placed:
                starts[i], durations[i] = placed[i]
                clock = starts[i] + durations[i]
            else:
                starts[i] = clock  # a space or a mark between words: no time of its own
        alignment = {"chars": list(text), "charStartTimesMs": starts, "charDurationsMs": durations}
        return {"alignment": alignment, "normalizedAlignment": dict(alignment)}

    async def send_bytes(self, data: bytes) -> bool:
        message = self._with_context(
            {"audio": base64.b64encode(data).decode("ascii"), "isFinal": None}, self.current
        )
        return await self._send_and_wait({"type": "websocket.send", "text": json.dumps(message)})

    async def close(self, code: int, reason: str = "", message: str = "") -> None:
        if code not in (1000, 1012) and self.accepted and not (self.closed or self.gone):
            # Their error shape before the close frame: their SDK raises it as the close's body.
            problem = {"message": message or reason, "error": reason, "code": code}
            with contextlib.suppress(Gone):  # the client may be gone already
                await self._send_text(problem)
        await super().close(code, reason, message)


class DeepgramSocket(DialectSocket):
    """``/v1/speak``: ``Speak``, ``Flush``, ``Clear``, ``Close`` in; binary audio, ``Metadata``,
    ``Flushed``, ``Cleared`` and ``Warning`` out. The voice is the ``model`` query parameter."""

    protocol = "deepgram"

    def setup(self) -> None:
        self.flushed = 0  # sequence ids of Flushed and Cleared
        self.cleared = 0
        self.voice = ""
        self.closing = False  # Close came: its own clear is not the client's Clear

    async def accept(self, subprotocol: str | None = None) -> None:
        await super().accept(subprotocol)
        try:
            self.pending.append(self._config())  # the config is the URL's: it comes first, unasked
        except DomainError as error:
            self.refusal = error

    def _config(self) -> dict[str, Any]:
        encoding = self.query.get("encoding", "linear16")
        if encoding not in DEEPGRAM_ENCODINGS:
            raise _invalid(
                f"encoding {encoding!r} is not served; use one of {', '.join(DEEPGRAM_ENCODINGS)}.",
                "encoding",
            )
        rate_text = self.query.get("sample_rate", str(DEEPGRAM_DEFAULT_RATES[encoding]))
        config: dict[str, Any] = {
            "type": "session.config",
            "response_format": DEEPGRAM_ENCODINGS[encoding],
            "sample_rate": int(rate_text) if rate_text.isdigit() else rate_text,
            "timestamps": False,  # no event of theirs carries them
        }
        if self.query.get("model"):
            config["voice"] = self.query["model"]
        if self.query.get("speed"):
            try:
                config["speed"] = float(self.query["speed"])
            except ValueError:
                config["speed"] = self.query["speed"]
        return config

    def events_of(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        kind = data.get("type")
        if kind == "Speak":
            text = data.get("text")
            if not isinstance(text, str):
                raise _invalid("Speak needs a text string.", "text")
            return [{"type": "input.text", "text": text}]
        if kind == "Flush":
            return [{"type": "input.done"}]
        if kind == "Clear":
            return [{"type": "input.clear"}]
        if kind == "Close":
            # Theirs closes at once: what is queued is dropped, not spoken.
            self.closing = True
            return [{"type": "input.clear"}, {"type": "session.close"}]
        raise _invalid(f"Unknown message type {str(kind)[:40]!r}; send Speak, Flush, Clear or Close.", "type")

    def messages_of(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "session.ready":
            self.voice = str(event.get("voice") or "")
            return [
                {
                    "type": "Metadata",
                    "request_id": str(event.get("session_id") or ""),
                    "model_name": self.voice,
                    "model_version": "tts-service",
                    "model_uuid": str(event.get("session_id") or ""),
                }
            ]
        if kind == "session.done":
            message = {"type": "Flushed", "sequence_id": self.flushed}
            self.flushed += 1
            return [message]
        if kind == "input.cleared" and not self.closing:
            message = {"type": "Cleared", "sequence_id": self.cleared}
            self.cleared += 1
            return [message]
        if kind == "error":
            return [
                {"type": "Warning", "description": event.get("message", ""), "code": event.get("code", "")}
            ]
        # audio.start, audio.done, timestamps, pong, session.closed: nothing in this dialect.
        return []


def socket_for(path: str) -> type[Socket] | None:
    """The socket class that speaks the protocol of ``path``; None: no session lives there."""
    if path == SESSION_PATH:
        return Socket
    if ELEVENLABS_PATH.match(path):
        return ElevenLabsSocket
    if path == DEEPGRAM_PATH:
        return DeepgramSocket
    return None
