"""The server's wait until a chunk left the web process (deploy/asgi_worker.py), as streams use it."""

from __future__ import annotations

import socket

from deploy import asgi_worker
from webapp.speech.api import streaming


def test_the_app_looks_for_the_extension_under_the_name_the_worker_offers() -> None:
    assert streaming.WAIT_SENT_EXTENSION == asgi_worker.WAIT_SENT_EXTENSION

    async def wait() -> bool:
        return True

    scope = {"extensions": {asgi_worker.WAIT_SENT_EXTENSION: wait}}
    assert streaming.server_wait_sent(type("Request", (), {"scope": scope})()) is wait
    assert streaming.server_wait_sent(object()) is None  # WSGI, Django's test client


def test_unsent_bytes_are_what_the_peer_has_not_read() -> None:
    mine, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine, peer:
        assert asgi_worker.unsent_bytes(mine) == 0
        mine.sendall(b"x" * 4096)
        assert asgi_worker.unsent_bytes(mine) > 0
        assert len(peer.recv(8192)) == 4096
        assert asgi_worker.unsent_bytes(mine) == 0
