"""What a streaming client that leaves was charged for and never received, on both ways Nginx may
reach the web tier: its unix socket (one host, systemd) and TCP (the Kubernetes layout).

The web tier counts a chunk handed once its socket to Nginx has drained (SIOCOUTQ,
deploy/asgi_worker.py). On a unix socket that is once Nginx read it, and Nginx reads only what it
can pass on; on TCP it is once Nginx's kernel acknowledged it, and what waits unread in Nginx's
receive buffer counts too. The client here reads at the pace of playback while the worker renders
far faster, then leaves; what it was charged for and never received is measured at the client:
the bytes of the sentences the job row says were handed, less the bytes that reached its socket.
docs/api.md states both figures. Measured on this machine with TTS_NGINX_SNDBUF at 64k: 38-156 KB
over the unix socket (whole sentences count, so it varies with where the client left), 0.4-1.5 MB
over TCP; with the kernel's autotuned send buffer instead, 3.8 MB over the unix socket, and over
TCP the whole 4 MB file charged for 0.2 MB received.
"""

from __future__ import annotations

import fcntl
import json
import socket
import ssl
import termios
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.bench.bench_soak import IN_TRANSIT_BYTES, dechunk
from tests.e2e.nginx_helpers import NginxInstance, start_nginx
from tests.integration.api.test_charged_as_delivered import LONG_TEXT, _job_of, _settlement, _wait_until
from tests.stack import TestStack, tcp_gunicorn

PCM_BYTES_PER_SECOND = 24000 * 2  # /v1/audio/speech's pcm: 24 kHz, 16-bit mono
READ_SECONDS = 4.0
# Over TCP, add what Nginx's kernel took and acknowledged for it: its receive buffer on the upstream
# connection, which autotunes (measured 0.4-1.5 MB here; docs/api.md).
TCP_ALLOWANCE_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def tcp_edge(stack: TestStack, web: Any) -> Iterator[NginxInstance]:
    """gunicorn on 127.0.0.1:<port> and an Nginx of its own in front of it, over TCP."""
    with tcp_gunicorn(stack, "gunicorn-tcp") as port:
        nginx = start_nginx(stack, "nginx-tcp", overrides={"UPSTREAM": f"127.0.0.1:{port}"})
        try:
            yield nginx
        finally:
            stack.stop_service(nginx.service)


def _listen_then_leave(port: int, key: str) -> int:
    """A streamed pcm answer read at playback pace for READ_SECONDS, then left: the payload bytes
    that reached the client's socket (read, or there when it left)."""
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "pcm"})
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        "X-Stainless-Raw-Response: stream\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as raw:
        # A player's socket holds a little audio, not the megabytes loopback's autotuning would
        # give it (which would hide every buffer behind it).
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw.settimeout(30)
        raw.connect(("127.0.0.1", port))
        with context.wrap_socket(raw, server_hostname="localhost") as conn:
            conn.sendall(head.encode() + body.encode())
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = conn.recv(4096)
                assert chunk, got
                got += chunk
            headers, answer = got.split(b"\r\n\r\n", 1)
            assert headers.startswith(b"HTTP/1.1 200"), headers
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < READ_SECONDS:
                allowed = int(elapsed * PCM_BYTES_PER_SECOND) + 4096
                if len(answer) < allowed:
                    answer += conn.recv(min(65536, allowed - len(answer)))
                else:
                    time.sleep(0.02)
            # Leaving: what waits in its socket was received too (counted whole: TLS and chunk
            # framing are a fraction of a percent). Read, it would only make room for more.
            waiting = int.from_bytes(fcntl.ioctl(conn, termios.FIONREAD, b"\0\0\0\0"), "little")
            waiting += conn.pending()
    received, whole = dechunk(answer)
    assert not whole, "the answer ended before the client left: nothing was measured"
    return received + waiting


def _charged_not_received(live_tenant: Any, port: int) -> int:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    received = _listen_then_leave(port, t.raw_key)
    job = _job_of(t.org)
    _wait_until(lambda: _settlement(job.id) is not None, 30, "the leaver's settlement")
    job = SynthesisJob.objects.get(id=job.id)
    assert _settlement(job.id).characters == job.delivered_chars > 0
    handed = job.delivered_seconds * PCM_BYTES_PER_SECOND
    print(f"handed {handed:.0f} bytes, received {received}: {handed - received:.0f} never received")
    return int(handed - received)


def test_over_a_unix_socket_a_leaver_is_charged_at_most_the_allowance_unreceived(
    live_tenant: Any, web: Any
) -> None:
    assert _charged_not_received(live_tenant, web.cfg.https_port) <= IN_TRANSIT_BYTES


def test_over_tcp_a_leaver_is_charged_at_most_the_tcp_allowance_unreceived(
    live_tenant: Any, tcp_edge: NginxInstance
) -> None:
    assert _charged_not_received(live_tenant, tcp_edge.cfg.https_port) <= TCP_ALLOWANCE_BYTES
