"""gunicorn's worker for the web tier: uvicorn's, with small write buffers on every connection.

A streamed answer charges what the server took from it (webapp/speech/api/streaming.py): audio
taken but still in a buffer between this process and the client when the client leaves is charged
and never heard. With the defaults, uvicorn keeps up to 64 KiB per connection before it stops taking
more, and the kernel about 200 KiB more in the socket to Nginx (which passes streams on unbuffered):
together more than a sentence of 24 kHz PCM. With STREAM_BUFFER_BYTES each, a send returns once at
most that much is queued here, and the kernel holds about twice that (it doubles SO_SNDBUF).
Measured by the soak's OpenAI clients that leave at random (tests/bench/bench_soak.py).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

STREAM_BUFFER_BYTES = 16 * 1024


class SmallBufferProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=STREAM_BUFFER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_BUFFER_BYTES)


class Worker(UvicornWorker):
    CONFIG_KWARGS: dict[str, Any] = {**UvicornWorker.CONFIG_KWARGS, "http": SmallBufferProtocol}
