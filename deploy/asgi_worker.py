"""gunicorn's worker for the web tier: uvicorn's, with small write buffers on every connection,
and an ASGI extension that says when what a connection was handed has left for Nginx.

A streamed answer charges what the server handed on (webapp/speech/api/streaming.py): audio
still in a buffer between this process and the client when the client leaves is charged and
never heard. With the defaults, uvicorn keeps up to 64 KiB per connection before it stops taking
more, and the kernel about 200 KiB more in the socket to Nginx: more than a sentence of 24 kHz
PCM. Here uvicorn keeps STREAM_BUFFER_BYTES and the socket about twice that (the kernel doubles
SO_SNDBUF), and ``scope["extensions"]["tts.wait_sent"]`` waits until both are empty: Nginx took
it (it passes streams on unbuffered, to a client whose socket then has it), or says the
connection closed first. A stream counts a chunk handed only after that wait said it left.
Measured by the soak's OpenAI clients that leave at random (tests/bench/bench_soak.py).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn_worker import UvicornWorker

from webapp.credentials import redact_query_keys

STREAM_BUFFER_BYTES = 16 * 1024
# The name webapp/speech/api/streaming.py looks for: the app imports nothing of deploy/, so the
# name is written twice, and tests/integration/api/test_wait_sent.py checks the two agree.
WAIT_SENT_EXTENSION = "tts.wait_sent"
# A realtime session's scope carries an asyncio.Event set when the worker starts its graceful
# shutdown: the session finishes the unit it is sending, then closes with 1012 (service restart).
DRAINING_EXTENSION = "tts.draining"
# WebSocket frames from clients: text messages of a session (a config, a piece of text) are small.
WS_MAX_MESSAGE_BYTES = 256 * 1024
WS_PING_INTERVAL, WS_PING_TIMEOUT = 20.0, 20.0
# Polled: the kernel tells no one when a socket's queue empties. Short at first (Nginx takes a
# chunk within a millisecond or two), then up to this while a slow client holds Nginx back.
_POLL_FIRST, _POLL_MOST, _FAST_POLLS = 0.001, 0.05, 100


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes written to the socket that its peer has not read yet (SIOCOUTQ, as TIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])


async def _wait_sent(transport: asyncio.Transport, sock: socket.socket | None) -> bool:
    pause, polls = _POLL_FIRST, 0
    while True:
        if transport.is_closing():
            return False
        if transport.get_write_buffer_size() == 0 and (sock is None or unsent_bytes(sock) == 0):
            return True
        await asyncio.sleep(pause)
        polls += 1
        if polls > _FAST_POLLS:
            pause = min(pause * 2, _POLL_MOST)


class SmallBufferProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=STREAM_BUFFER_BYTES)
        self.sock: socket.socket | None = transport.get_extra_info("socket")
        if self.sock is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_BUFFER_BYTES)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[typeddict-item]
        extensions[WAIT_SENT_EXTENSION] = self.wait_sent

    async def wait_sent(self) -> bool:
        """Wait until this connection's buffers are empty: True, what it was handed left for Nginx;
        False when the connection closed first (uvicorn drops what is sent after that, silently).

        The close is looked at first: once Nginx closed the socket, the kernel discards what it
        had not read, and the queue looks empty. A chunk Nginx took in the last poll before its
        close is not counted (the client's favour, by at most one chunk).
        """
        return await _wait_sent(self.transport, self.sock)


class SmallBufferWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (websockets' sans-I/O core) with the same small send buffers and
    the same ``tts.wait_sent`` as the HTTP one: a session's audio counts as handed once it left
    the process. Its graceful shutdown lets the session finish its unit (``tts.draining``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.transport.set_write_buffer_limits(high=STREAM_BUFFER_BYTES)
        self.sock: socket.socket | None = self.transport.get_extra_info("socket")
        if self.sock is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_BUFFER_BYTES)
        self.draining = asyncio.Event()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            extensions: dict[str, Any] = scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[WAIT_SENT_EXTENSION] = self.wait_sent
            extensions[DRAINING_EXTENSION] = self.draining

    async def wait_sent(self) -> bool:
        return await _wait_sent(self.transport, self.sock)

    def shutdown(self) -> None:
        """Graceful shutdown: an open session is told (it closes with 1012 after its unit); the server
        waits for it up to gunicorn's graceful timeout, then closes what is left."""
        if self.handshake_complete and not self.close_sent and not self.transport.is_closing():
            self.draining.set()
            return
        super().shutdown()


class QueryKeyFilter(logging.Filter):
    """uvicorn logs each request's and each WebSocket's path with its query string: a key sent as
    ``?xi-api-key=`` is written as REDACTED, as in Nginx's access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query_keys(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query_keys(record.msg)
        return True


class Worker(UvicornWorker):
    CONFIG_KWARGS: dict[str, Any] = {
        **UvicornWorker.CONFIG_KWARGS,
        "http": SmallBufferProtocol,
        "ws": SmallBufferWebSocketProtocol,
        "ws_max_size": WS_MAX_MESSAGE_BYTES,
        "ws_ping_interval": WS_PING_INTERVAL,
        "ws_ping_timeout": WS_PING_TIMEOUT,
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("uvicorn.access", "uvicorn.error"):
            logging.getLogger(name).addFilter(QueryKeyFilter())
