"""What Nginx tells the application about the client, and real_ip mode behind a load balancer.

Nginx is the thing under test here, so the upstream is a recorder on a Unix
socket that answers with the headers it received: it shows exactly what
Django would be given, which no Django page echoes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.e2e.nginx_helpers import NginxInstance, client, start_nginx, wait_for_log
from tests.stack import CFG
from tests.stack import TestStack as Stack


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:  # Unix peers have no address to log
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def recorder_socket() -> Iterator[str]:
    path = CFG.path("run", "nginx-recorder.sock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = _UnixServer(str(path), _Recorder)
    os.chmod(path, 0o777)  # Nginx workers run as nobody
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield str(path)
    finally:
        server.shutdown()
        server.server_close()
        path.unlink()


@pytest.fixture(scope="module")
def edge(stack: Stack, recorder_socket: str) -> Iterator[NginxInstance]:
    instance = start_nginx(stack, "nginx-edge", overrides={"UPSTREAM": f"unix:{recorder_socket}"})
    try:
        yield instance
    finally:
        stack.stop_service(instance.service)


@pytest.fixture(scope="module")
def behind_balancer(stack: Stack, recorder_socket: str) -> Iterator[NginxInstance]:
    # 127.0.0.2 plays the load balancer; nobody else is trusted.
    instance = start_nginx(
        stack,
        "nginx-realip",
        env={"TTS_NGINX_REAL_IP_FROM": "127.0.0.2"},
        overrides={"UPSTREAM": f"unix:{recorder_socket}"},
    )
    try:
        yield instance
    finally:
        stack.stop_service(instance.service)


FORGED = {
    "X-Forwarded-For": "10.9.9.9",
    "X-Real-IP": "10.9.9.9",
    "X-Forwarded-Proto": "http",
    "X-Forwarded-Host": "evil.example",
    "Forwarded": "for=10.9.9.9;proto=http",
    "X_Real_IP": "10.9.9.9",
}


@pytest.mark.parametrize("path", ["/api/v1/voices", "/v1/audio/speech", "/", "/accounts/login/"])
def test_client_forwarding_headers_are_replaced(edge: NginxInstance, path: str) -> None:
    response = client("127.0.0.1").post(edge.url(path), headers=FORGED, json={}, timeout=20)
    assert response.status_code == 200
    seen = response.json()
    assert seen["x-real-ip"] == "127.0.0.1"
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-proto"] == "https"
    for header in ("x-forwarded-host", "forwarded", "x_real_ip"):
        assert header not in seen
    assert seen["host"] == f"127.0.0.1:{edge.cfg.https_port}"
    # The request id the application sees is the one in the access log.
    logged = wait_for_log(edge, lambda e: e["request_id"] == seen["x-request-id"])
    assert logged and logged[0]["remote_addr"] == "127.0.0.1" and logged[0]["uri"] == path


def test_access_log_is_json_with_timings_and_limit_status(edge: NginxInstance) -> None:
    client("127.0.0.1").get(edge.url("/api/v1/usage?x=1"), timeout=20)
    entry = wait_for_log(edge, lambda e: e["uri"] == "/api/v1/usage?x=1")[0]
    assert entry["status"] == 200 and entry["method"] == "GET"
    assert isinstance(entry["request_time"], float | int)
    assert float(entry["upstream_time"]) >= 0
    assert entry["upstream_status"] == "200"
    assert entry["limit_req"] == "PASSED" and entry["limit_conn"] == "PASSED"
    assert entry["tls"] in ("TLSv1.2", "TLSv1.3")


def test_real_ip_mode_trusts_the_balancer_only(behind_balancer: NginxInstance) -> None:
    via_balancer = client("127.0.0.2").get(
        behind_balancer.url("/api/v1/voices"), headers={"X-Forwarded-For": "203.0.113.7"}, timeout=20
    )
    assert via_balancer.json()["x-real-ip"] == "203.0.113.7"
    assert via_balancer.json()["x-forwarded-for"] == "203.0.113.7"
    # Anyone else claiming a forwarded address is taken at its own address.
    direct = client("127.0.0.1").get(
        behind_balancer.url("/api/v1/voices"), headers={"X-Forwarded-For": "203.0.113.7"}, timeout=20
    )
    assert direct.json()["x-real-ip"] == "127.0.0.1"
    logged = wait_for_log(behind_balancer, lambda e: e["uri"] == "/api/v1/voices", count=2)
    assert {e["remote_addr"] for e in logged} == {"203.0.113.7", "127.0.0.1"}


@pytest.mark.parametrize("sent", ["localhost:x", "localhost:1", "LOCALHOST", "localhost"])
def test_the_host_goes_on_with_this_servers_own_port(edge: NginxInstance, sent: str) -> None:
    """A served name with any port (or none) reaches Django as that name on Nginx's HTTPS port:
    "localhost:x" used to pass Nginx and fail in Django (with DEBUG, its page listed the settings)."""
    response = client("127.0.0.1").get(edge.url("/api/v1/voices"), headers={"Host": sent}, timeout=20)
    assert response.status_code == 200
    assert response.json()["host"] == f"localhost:{edge.cfg.https_port}"
