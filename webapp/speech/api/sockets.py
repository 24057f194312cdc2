"""The WebSocket side of webapp/asgi.py: one realtime session per socket, in the dialect its path names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import ThreadSensitiveContext

from webapp.errors import ErrorCode
from webapp.speech.api.dialects import socket_for
from webapp.speech.api.session_socket import Session, Socket


async def session_app(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    """Native sessions at /v1/audio/speech/stream; ElevenLabs' and Deepgram's at their paths."""
    kind = socket_for(str(scope.get("path") or ""))
    socket = (kind or Socket)(scope, receive, send)
    first = await socket.receive()
    if first["type"] != "websocket.connect":
        return
    if kind is None:
        await socket.close(4404, ErrorCode.NOT_FOUND.value)
        return
    # The session's sync calls run in a thread of its own (not one shared by every session).
    async with ThreadSensitiveContext():
        await Session(socket).run()
