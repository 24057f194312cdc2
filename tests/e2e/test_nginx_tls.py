"""TLS through the real Nginx: protocols, ciphers, HTTP/2, the HTTP redirect, security headers."""

from __future__ import annotations

import re
import socket
import ssl
from typing import Any

import pytest

from tests.e2e.nginx_helpers import HSTS, client, openssl_connect
from tests.stack import CFG

pytestmark = pytest.mark.usefixtures("web")


def _negotiated(result: Any) -> str:
    """The protocol of the established session ("New, TLSv1.3, Cipher is ..."), or ""."""
    match = re.search(r"^New, (TLSv1\.\d), Cipher is (?!\(NONE\))", result.stdout, re.M)
    return match.group(1) if match else ""


def test_tls_1_1_is_refused() -> None:
    # SECLEVEL=0 lets this OpenSSL offer TLS 1.1 at all; the server must still say no.
    result = openssl_connect(CFG.https_port, "-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0")
    assert result.returncode != 0
    # The server answered with a protocol_version alert: no session was set up.
    assert "alert protocol version" in result.stderr
    assert "Cipher is (NONE)" in result.stdout


@pytest.mark.parametrize("version", ["-tls1_2", "-tls1_3"])
def test_tls_1_2_and_1_3_are_served(version: str) -> None:
    result = openssl_connect(CFG.https_port, version)
    assert result.returncode == 0, result.stderr
    assert "Cipher is (NONE)" not in result.stdout
    assert _negotiated(result) == {"-tls1_2": "TLSv1.2", "-tls1_3": "TLSv1.3"}[version]


@pytest.mark.parametrize(
    ("cipher", "accepted"),
    [
        ("ECDHE-RSA-AES128-GCM-SHA256", True),
        ("ECDHE-RSA-CHACHA20-POLY1305", True),
        ("DHE-RSA-AES256-GCM-SHA384", True),  # needs the ffdhe2048 parameters
        ("AES128-SHA", False),  # static RSA, CBC: not in "intermediate"
        ("ECDHE-RSA-AES128-SHA256", False),  # CBC
    ],
)
def test_only_intermediate_ciphers_on_tls_1_2(cipher: str, accepted: bool) -> None:
    result = openssl_connect(CFG.https_port, "-tls1_2", "-cipher", cipher)
    assert (result.returncode == 0) is accepted, result.stdout[-500:] + result.stderr[-500:]


def test_http2_is_offered() -> None:
    result = openssl_connect(CFG.https_port, "-alpn", "h2,http/1.1")
    assert result.returncode == 0
    assert "ALPN protocol: h2" in result.stdout


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_http_redirects_to_https_on_the_https_port(host: str) -> None:
    response = client().get(
        f"http://127.0.0.1:{CFG.http_port}/api/v1/voices?limit=2&x=%C3%A9",
        headers={"Host": f"{host}:{CFG.http_port}"},
        allow_redirects=False,
        timeout=10,
    )
    assert response.status_code == 301
    assert response.headers["Location"] == f"https://{host}:{CFG.https_port}/api/v1/voices?limit=2&x=%C3%A9"


def test_security_headers_on_proxied_pages_and_errors() -> None:
    session = client()
    for path, status in (("/healthz", None), ("/no-such-page/", 404), ("/api/v1/no-such-thing", 404)):
        response = session.get(f"https://127.0.0.1:{CFG.https_port}{path}", timeout=20)
        if status is not None:
            assert response.status_code == status
        # Exactly one copy of each (Django's own are hidden), on success and on errors.
        assert response.headers["Strict-Transport-Security"] == HSTS
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "same-origin"
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        assert "Server" not in response.headers or response.headers["Server"] == "nginx"


def _directives(policy: str) -> dict[str, list[str]]:
    parts = [item.split() for item in policy.split(";") if item.strip()]
    return {part[0]: part[1:] for part in parts}


def test_no_page_but_the_api_reference_allows_inline_styles_or_scripts() -> None:
    """Templates keep their styles in static CSS: 'unsafe-inline' only where Redoc needs it."""
    session = client()
    base = f"https://127.0.0.1:{CFG.https_port}"
    for path in ("/", "/accounts/login/", "/accounts/signup/", "/app/account/", "/api/v1/voices", "/nope/"):
        response = session.get(base + path, timeout=20, allow_redirects=False)
        policy = _directives(response.headers["Content-Security-Policy"])
        assert policy["style-src"] == ["'self'"], (path, policy)
        assert policy["script-src"] == ["'self'"], (path, policy)
        assert "'unsafe-inline'" not in response.headers["Content-Security-Policy"], path
    docs = session.get(base + "/api/docs", timeout=20)
    assert docs.status_code == 200
    policy = _directives(docs.headers["Content-Security-Policy"])
    # Redoc (styled-components) writes its styles at run time; still no inline script.
    assert policy["style-src"] == ["'self'", "'unsafe-inline'"]
    assert policy["script-src"] == ["'self'"]


def test_no_tls_1_3_session_ticket_follows_the_handshake() -> None:
    """A ticket arriving while a threaded client writes its request broke Python's sync WebSocket
    clients (docs/decisions.md); the server sends none."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with socket.create_connection(("127.0.0.1", CFG.https_port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(4096):  # to the end: any ticket came before the answer's close
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 ")  # an answer (503 while no worker is up)
            assert tls.version() == "TLSv1.3"
            assert tls.session is not None and not tls.session.has_ticket
