"""A realtime-session client for the tests: the ``websockets`` library's own client, through Nginx and TLS.

``Events`` reads what the server sends until a condition holds, keeping each JSON event and
each binary frame with the monotonic time it arrived.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.sync.connection import Connection

SESSION_PATH = "/v1/audio/speech/stream"


def tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the stack's own certificate
    return context


def open_session(
    https_port: int,
    raw_key: str | None,
    *,
    path: str = SESSION_PATH,
    headers: dict[str, str] | None = None,
    subprotocols: list[str] | None = None,
) -> ClientConnection:
    extra = dict(headers or {})
    if raw_key is not None and not headers and not subprotocols:
        extra["Authorization"] = f"Bearer {raw_key}"
    return connect(
        f"wss://127.0.0.1:{https_port}{path}",
        ssl=tls_context(),
        additional_headers=extra,
        subprotocols=subprotocols,  # type: ignore[arg-type]
        # Handshakes take milliseconds; on a 2-core host beside a CPU-bound process, one right after
        # gunicorn started has taken over 10 s.
        open_timeout=30,
        max_size=None,
    )


@dataclass
class Received:
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    frames: list[tuple[float, bytes]] = field(default_factory=list)
    order: list[Any] = field(default_factory=list)  # events (dicts) and frames (bytes) in arrival order
    close_code: int | None = None
    close_reason: str = ""

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e.get("type") == kind]

    @property
    def audio(self) -> bytes:
        return b"".join(f for _, f in self.frames)


def send(ws: Connection, event: dict[str, Any]) -> None:
    ws.send(json.dumps(event))


def read_until(ws: Connection, got: Received, done: Any, timeout: float = 60) -> Received:
    """Read into ``got`` until ``done(got)`` is true, the socket closes, or ``timeout`` passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while not done(got):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out; received {[e for _, e in got.events][-8:]}")
        try:
            message = ws.recv(timeout=left)
        except TimeoutError:
            continue
        except ConnectionClosed as closed:
            got.close_code = closed.rcvd.code if closed.rcvd else None
            got.close_reason = closed.rcvd.reason if closed.rcvd else ""
            return got
        now = time.monotonic()
        if isinstance(message, bytes):
            got.frames.append((now, message))
            got.order.append(message)
        else:
            event = json.loads(message)
            got.events.append((now, event))
            got.order.append(event)
    return got


def closed(got: Received) -> bool:
    return got.close_code is not None


def open_plain(
    port: int,
    raw_key: str | None,
    *,
    headers: dict[str, str] | None = None,
    sock: socket.socket | None = None,
    max_queue: int = 16,
) -> ClientConnection:
    """Straight to a gunicorn of the test's own over TCP (no Nginx): for limits set in its environment.

    ``sock``: a socket already connected to ``port`` (one with socket options of the test's own);
    ``max_queue``: the frames the library's reader thread takes before it stops reading.
    """
    extra = dict(headers or {})
    if raw_key is not None and not headers:
        extra["Authorization"] = f"Bearer {raw_key}"
    return connect(
        f"ws://127.0.0.1:{port}{SESSION_PATH}",
        sock=sock,
        additional_headers=extra,
        open_timeout=10,
        max_size=None,
        max_queue=max_queue,
    )
