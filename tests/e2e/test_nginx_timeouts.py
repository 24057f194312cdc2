"""Slow clients do not hold a connection: header, body and send timeouts through a real Nginx.

An Nginx of its own with 1 s timeouts, in front of the test stack's gunicorn.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.e2e.nginx_helpers import NginxInstance, start_nginx, wait_for_log
from tests.stack import TestStack as Stack

TIMEOUTS = {
    "TTS_NGINX_CLIENT_HEADER_TIMEOUT": "1s",
    "TTS_NGINX_CLIENT_BODY_TIMEOUT": "1s",
    "TTS_NGINX_SEND_TIMEOUT": "1s",
}


@pytest.fixture(scope="module")
def slow_edge(web: Stack) -> Iterator[NginxInstance]:
    instance = start_nginx(web, "nginx-timeouts", env=TIMEOUTS)
    try:
        yield instance
    finally:
        web.stop_service(instance.service)


def _tls(instance: NginxInstance, source: str) -> ssl.SSLSocket:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    raw = socket.create_connection(
        ("127.0.0.1", instance.cfg.https_port), timeout=10, source_address=(source, 0)
    )
    return context.wrap_socket(raw, server_hostname="localhost")


def _closed_within(conn: ssl.SSLSocket, limit: float) -> float:
    """Seconds until Nginx closes the connection (reading whatever it sends first)."""
    start = time.monotonic()
    conn.settimeout(limit)
    try:
        while conn.recv(4096):
            pass
    except (ConnectionResetError, ssl.SSLError):
        pass
    except TimeoutError:
        raise AssertionError(f"Nginx still held the connection after {limit} s") from None
    return time.monotonic() - start


def test_headers_sent_slowly_are_cut_off(slow_edge: NginxInstance) -> None:
    with _tls(slow_edge, "127.0.4.1") as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # no blank line: headers unfinished
        # 1 s of client_header_timeout (the default is 60 s); slack for a loaded machine.
        assert _closed_within(conn, 15) < 15


def test_a_body_sent_slowly_is_cut_off(slow_edge: NginxInstance) -> None:
    with _tls(slow_edge, "127.0.4.2") as conn:
        conn.sendall(
            b"POST /api/v1/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"text":'
        )
        assert _closed_within(conn, 15) < 15
    # Nginx's own 408, never sent to Django.
    logged = wait_for_log(
        slow_edge, lambda e: e["remote_addr"] == "127.0.4.2" and e["uri"] == "/api/v1/speech"
    )
    assert logged and logged[0]["status"] == 408 and logged[0]["upstream_status"] == ""


def test_the_timeouts_are_in_the_rendered_config(slow_edge: NginxInstance) -> None:
    text = slow_edge.conf.read_text()
    for directive in ("client_header_timeout 1s;", "client_body_timeout 1s;", "send_timeout 1s;"):
        assert directive in text
