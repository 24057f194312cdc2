"""The webhook sender's SSRF rules (webapp/outbound.py): which addresses it refuses, and how it connects.

Address classes are judged without a network; the connection rules against a
tiny HTTP server on 127.0.0.1 (allowed by TTS_WEBHOOK_ALLOW_PRIVATE here), with a
resolver the test controls, so "what the name resolves to" is the test's choice.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from webapp import outbound as net

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),  # deprecated, still routed inside some networks; Python calls it global
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "shared"),
        ("100.127.255.254", "shared"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "loopback (in)"),
        ("::ffff:10.0.0.1", "private (in)"),
        ("::ffff:169.254.169.254", "metadata (in)"),
        ("::ffff:100.64.0.1", "shared (in)"),
        ("64:ff9b::a00:1", "private (in)"),
        ("2002:7f00:1::", "loopback (in)"),
    ],
)
def test_it_refuses_every_internal_address_class(address: str, kind: str) -> None:
    ip = ipaddress.ip_address(address)
    kind = kind.replace("(in)", f"(in {ip})")  # an IPv6 address that carries an internal IPv4 one
    assert net.address_class(ip) == kind
    assert net.refusal(ip, []) == f"{ip} is a {kind} address"


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1"])
def test_it_lets_public_addresses_through(address: str) -> None:
    assert net.refusal(ipaddress.ip_address(address), []) is None


def test_the_setting_names_the_internal_addresses_it_allows() -> None:
    allowed = [ipaddress.ip_network("10.20.0.0/16"), ipaddress.ip_network("127.0.0.1/32")]
    assert net.refusal(ipaddress.ip_address("10.20.3.4"), allowed) is None
    assert (
        net.refusal(ipaddress.ip_address("::ffff:10.20.3.4"), allowed) is None
    )  # mapped, by its IPv4 address
    assert net.refusal(ipaddress.ip_address("10.21.0.1"), allowed) is not None
    assert net.refusal(ipaddress.ip_address("127.0.0.2"), allowed) is not None
    assert net.refusal(ipaddress.ip_address("169.254.169.254"), allowed) is not None


def test_the_setting_reads_addresses_and_cidrs_and_refuses_anything_else() -> None:
    from webapp.env import EnvError, env_networks

    nets = env_networks("X", "", {"X": "127.0.0.1, 10.0.0.0/8,fd00::/8"})
    assert [str(n) for n in nets] == ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]
    with pytest.raises(EnvError, match="X: 'localhost'"):
        env_networks("X", "", {"X": "localhost"})


def _names(mapping: dict[str, list[str]], calls: list[str]) -> net.Resolver:
    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return mapping[host]

    return resolve


def test_one_internal_address_among_public_ones_refuses_the_name(settings: Any) -> None:
    settings.TTS_WEBHOOK_ALLOW_PRIVATE = []
    resolver = _names({"mixed.example": ["93.184.215.14", "10.0.0.7"]}, [])
    with pytest.raises(net.Refused, match="10.0.0.7 is a private address"):
        net.target("https://mixed.example/hook", resolver)


def test_plain_http_goes_only_to_allowed_addresses(settings: Any) -> None:
    settings.TTS_WEBHOOK_ALLOW_PRIVATE = LOOPBACK
    resolver = _names({"public.example": ["93.184.215.14"], "local.example": ["127.0.0.1"]}, [])
    with pytest.raises(net.Refused, match="plain http"):
        net.target("http://public.example/hook", resolver)
    assert net.target("http://local.example:8080/h?q=1", resolver).path == "/h?q=1"
    assert net.target("https://public.example/hook", resolver).addresses == (
        ipaddress.ip_address("93.184.215.14"),
    )


@pytest.mark.parametrize(
    "url", ["ftp://example.com/", "https://u:p@example.com/", "https:///nohost", "https://example.com:http/"]
)
def test_it_refuses_urls_of_other_forms(url: str) -> None:
    with pytest.raises(net.Refused):
        net.check_url_form(url)


class _Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.mode = "ok"


@contextlib.contextmanager
def _server() -> Iterator[tuple[_Server, int]]:
    state = _Server()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append({"host": self.headers.get("Host", ""), "path": self.path})
            if state.mode == "slow":
                time.sleep(3)
            if state.mode == "redirect":
                self.send_response(302)
                self.send_header("Location", "/elsewhere")  # a redirect a follower would take
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"x" * (1 << 20) if state.mode == "huge" else b"fine"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the sender stops reading after a few KB
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def local(settings: Any) -> Iterator[tuple[_Server, int]]:
    settings.TTS_WEBHOOK_ALLOW_PRIVATE = LOOPBACK
    settings.TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.TTS_WEBHOOK_READ_TIMEOUT_SECONDS = 1.0
    with _server() as s:
        yield s


def test_it_connects_to_the_checked_address_with_the_name_in_the_host_header(
    local: tuple[_Server, int],
) -> None:
    state, port = local
    calls: list[str] = []
    answer = net.post(
        f"http://hooks.example.test:{port}/in",
        b"{}",
        {},
        resolver=_names({"hooks.example.test": ["127.0.0.1"]}, calls),
    )
    assert answer.ok and answer.excerpt == "fine"
    assert calls == ["hooks.example.test"]  # resolved once: the socket went to that address
    assert state.requests == [{"host": f"hooks.example.test:{port}", "path": "/in"}]


def test_a_name_that_resolves_inside_is_refused_before_any_connection(
    settings: Any, local: tuple[_Server, int]
) -> None:
    state, port = local
    settings.TTS_WEBHOOK_ALLOW_PRIVATE = []
    answer = net.post(
        f"https://rebind.example:{port}/", b"{}", {}, resolver=_names({"rebind.example": ["127.0.0.1"]}, [])
    )
    assert answer.status is None and state.requests == []
    # The tenant reads the rule, never what the name resolved to; the operator's log has both.
    assert answer.error == net.REFUSED_BY_RULES and "127.0.0.1" not in answer.error
    assert "loopback" in answer.detail and "127.0.0.1" in answer.detail


def test_a_name_that_does_not_resolve_reads_as_one_that_resolves_inside(settings: Any) -> None:
    """Else a tenant could tell which internal names exist."""
    settings.TTS_WEBHOOK_ALLOW_PRIVATE = []
    import socket

    def names(host: str, port: int) -> list[str]:
        if host == "db.internal":
            return ["10.0.0.5"]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    inside = net.post("https://db.internal/", b"{}", {}, resolver=names)
    nowhere = net.post("https://nothing.internal/", b"{}", {}, resolver=names)
    assert inside.error == nowhere.error == net.REFUSED_BY_RULES


def test_it_follows_no_redirect(local: tuple[_Server, int]) -> None:
    state, port = local
    state.mode = "redirect"
    answer = net.post(f"http://127.0.0.1:{port}/first", b"{}", {})
    assert answer.status == 302 and not answer.ok
    assert [r["path"] for r in state.requests] == ["/first"]


def test_it_reads_a_few_kilobytes_of_a_huge_answer(local: tuple[_Server, int]) -> None:
    state, port = local
    state.mode = "huge"
    answer = net.post(f"http://127.0.0.1:{port}/", b"{}", {})
    assert answer.ok and len(answer.excerpt) == net.EXCERPT_CHARS


def test_a_slow_receiver_times_out(local: tuple[_Server, int]) -> None:
    state, port = local
    state.mode = "slow"
    started = time.monotonic()
    answer = net.post(f"http://127.0.0.1:{port}/", b"{}", {})
    assert answer.status is None and "timed out" in answer.error
    assert time.monotonic() - started < 2.5


def test_a_port_nobody_listens_on_is_a_connect_error(local: tuple[_Server, int]) -> None:
    from tests.stack import spare_port

    answer = net.post(f"http://127.0.0.1:{spare_port()}/", b"{}", {})
    # "no answer", as for an address that drops the connection: a port's state is not the tenant's to map.
    assert answer.status is None and answer.error == net.NO_ANSWER
    assert answer.detail.startswith("connect to 127.0.0.1")


def test_https_checks_the_certificate_against_the_name_not_the_address(settings: Any, tmp_path: Any) -> None:
    """TLS to the pinned address: SNI and the certificate check use the URL's host."""
    import ssl
    import subprocess

    settings.TTS_WEBHOOK_ALLOW_PRIVATE = LOOPBACK
    settings.TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS = settings.TTS_WEBHOOK_READ_TIMEOUT_SECONDS = 2.0

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    name = "hooks.example.test"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}"]
        + ["-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(str(cert), str(key))
    seen_sni: list[str | None] = []
    server_context.sni_callback = lambda sock, server_name, ctx: seen_sni.append(server_name)  # type: ignore[assignment,func-returns-value]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    resolver = _names({name: ["127.0.0.1"]}, [])
    try:
        untrusted = net.post(f"https://{name}:{port}/", b"{}", {}, resolver=resolver)
        assert untrusted.status is None and "CERTIFICATE_VERIFY_FAILED" in untrusted.error
        settings.TTS_WEBHOOK_CA_FILE = str(cert)
        trusted = net.post(f"https://{name}:{port}/", b"{}", {}, resolver=resolver)
        assert trusted.status == 204, trusted.error
        assert seen_sni[-1] == name
        by_address = net.post(f"https://127.0.0.1:{port}/", b"{}", {})  # the certificate names no address
        assert by_address.status is None and "CERTIFICATE_VERIFY_FAILED" in by_address.error
    finally:
        server.shutdown()
        server.server_close()
