"""Sending one webhook request without letting a tenant's URL reach inside the network (SSRF).

At every delivery the host is resolved and *every* address it has is judged
(:func:`refusal`): loopback, private, link-local (with the cloud metadata
address 169.254.169.254 and fd00:ec2::254), multicast, unspecified, shared
(100.64.0.0/10), reserved and the like are refused, and so are IPv6 addresses
that carry one of those (IPv4-mapped, 6to4, Teredo, NAT64), unless
``TTS_WEBHOOK_ALLOW_PRIVATE`` names the address. The connection then goes to
an address that was checked: the socket is opened to that IP, never to the
name (no second resolution that DNS could answer differently), while the
``Host`` header and TLS SNI/certificate check use the name. Redirects are not
followed (http.client never does), connect and read have their timeouts, and
at most :data:`MAX_BODY_BYTES` of the answer are read. Plain ``http`` is used
only when every address is one the setting allows (a receiver inside a test
or a private network); elsewhere ``https`` with the system's CAs, plus
``TTS_WEBHOOK_CA_FILE`` when set.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# How much of an answer is read and kept (the attempt log's excerpt).
MAX_BODY_BYTES = 4096
EXCERPT_CHARS = 1000

_SHARED = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = (ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128"))


class Refused(Exception):
    """The URL may not be called: the message says why (it goes to the attempt log)."""


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, where the network would route to it."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_class(address: IPAddress) -> str | None:
    """What makes ``address`` internal ("loopback", "private", ...), or None for a public one."""
    inner = _embedded_ipv4(address)
    if inner is not None:
        kind = address_class(inner)
        return None if kind is None else f"{kind} (in {address})"
    if any(address in net for net in _METADATA):
        return "metadata"
    checks: Sequence[tuple[str, bool]] = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        # fec0::/10: deprecated, but routed inside the networks that still use it (is_global says yes).
        ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
        ("multicast", address.is_multicast),
        ("shared", isinstance(address, ipaddress.IPv4Address) and address in _SHARED),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    )
    for kind, hit in checks:
        if hit:
            return kind
    return None if address.is_global else "not global"


def allowed_networks() -> list[IPNetwork]:
    return list(settings.TTS_WEBHOOK_ALLOW_PRIVATE)


def is_allowed(address: IPAddress, allowed: Sequence[IPNetwork] | None = None) -> bool:
    """Whether TTS_WEBHOOK_ALLOW_PRIVATE names the address (an IPv4-mapped one by its IPv4 address too)."""
    nets = allowed_networks() if allowed is None else allowed
    inner = _embedded_ipv4(address)
    return any(
        a in net for net in nets for a in (address, inner) if a is not None and a.version == net.version
    )


def refusal(address: IPAddress, allowed: Sequence[IPNetwork] | None = None) -> str | None:
    """Why a request may not go to ``address`` (None: it may)."""
    if is_allowed(address, allowed):
        return None
    kind = address_class(address)
    return None if kind is None else f"{address} is a {kind} address"


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as the URL names it: the Host header and the TLS server name
    port: int
    path: str  # path and query
    addresses: tuple[IPAddress, ...]  # every address the host resolved to, each checked


def check_url_form(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a URL a webhook may name, or Refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise Refused("the URL must start with https://")
    if parts.username is not None or parts.password is not None:
        raise Refused("the URL must not carry a user name or password")
    if not parts.hostname:
        raise Refused("the URL has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("the URL's port is not a number") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


def check_literal(url: str) -> None:
    """The checks a URL gets when it is saved: its form, and an IP literal's address.

    A host name is judged at each delivery, when it is resolved (what it points at may change).
    """
    scheme, host, _port, _path = check_url_form(url)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if scheme == "http":
            raise Refused("the URL must start with https:// (http is only for allowed addresses)") from None
        return
    why = refusal(address)
    if why is not None:
        raise Refused(f"{why}; webhooks go to public addresses only")
    if scheme == "http" and not is_allowed(address):
        raise Refused("the URL must start with https:// (http is only for allowed addresses)")


def target(url: str, resolver: Resolver = resolve) -> Target:
    """Resolve and judge the URL now: every address must be allowed, or Refused."""
    scheme, host, port, path = check_url_form(url)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(host, port)]
        except (OSError, UnicodeError) as exc:
            raise Refused(f"{host} does not resolve: {exc}") from None
    if not addresses:
        raise Refused(f"{host} has no address")
    for address in addresses:
        why = refusal(address)
        if why is not None:
            raise Refused(f"{host}: {why}; webhooks go to public addresses only")
    if scheme == "http" and not all(is_allowed(a) for a in addresses):
        raise Refused("plain http is only for addresses TTS_WEBHOOK_ALLOW_PRIVATE names; use https")
    return Target(scheme, host, port, path, tuple(addresses))


# What a tenant reads about a failed attempt. Never the addresses a name resolved to, their class or a
# port's state: a tenant's admin must not map the service's network through its own webhook URLs.
REFUSED_BY_RULES = "refused by the address rules: webhooks go to public addresses that the name resolves to"
NO_ANSWER = "no answer"


@dataclass(frozen=True)
class Answer:
    status: int | None
    latency_ms: int
    excerpt: str
    error: str = ""  # for the tenant (the attempt log): REFUSED_BY_RULES, NO_ANSWER, "timed out", ...
    detail: str = ""  # for the operator's log: the addresses and the system's own words

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@cache
def _tls_context(ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the checked address, not to whatever the host name resolves to now."""

    def __init__(self, host: str, port: int, address: IPAddress, connect_timeout: float, read_timeout: float):
        super().__init__(host, port, timeout=read_timeout)
        self._address = address
        self._connect_timeout = connect_timeout

    def _open(self) -> socket.socket:
        sock = socket.create_connection((str(self._address), self.port), timeout=self._connect_timeout)
        sock.settimeout(self.timeout)
        return sock

    def connect(self) -> None:
        self.sock = self._open()


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    def __init__(self, *args: object, context: ssl.SSLContext, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._context = context

    def connect(self) -> None:
        # The name, not the address, for SNI and the certificate's check.
        self.sock = self._context.wrap_socket(self._open(), server_hostname=self.host)


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    resolver: Resolver = resolve,
) -> Answer:
    """POST ``body`` to ``url`` under the rules above; never raises for the receiver's faults."""
    started = time.monotonic()

    def answer(status: int | None, excerpt: str = "", error: str = "", detail: str = "") -> Answer:
        latency = int((time.monotonic() - started) * 1000)
        return Answer(status, latency, excerpt, error[:500], (detail or error)[:500])

    try:
        where = target(url, resolver)
    except Refused as exc:
        return answer(None, error=REFUSED_BY_RULES, detail=f"refused: {exc}")
    connect_timeout = float(settings.TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS)
    read_timeout = float(settings.TTS_WEBHOOK_READ_TIMEOUT_SECONDS)
    last_error = ""
    for address in where.addresses:  # each checked; the next only when one cannot be connected to
        conn: _PinnedHTTPConnection
        if where.scheme == "https":
            context = _tls_context(settings.TTS_WEBHOOK_CA_FILE)
            conn = _PinnedHTTPSConnection(
                where.host, where.port, address, connect_timeout, read_timeout, context=context
            )
        else:
            conn = _PinnedHTTPConnection(where.host, where.port, address, connect_timeout, read_timeout)
        try:
            try:
                conn.connect()
            except ssl.SSLError as exc:
                # Connected, and the receiver's TLS failed (its certificate, its protocol): its to know.
                return answer(None, error=f"TLS: {exc}")
            except OSError as exc:
                # Refused, unreachable or silent alike: the tenant is not told which (a port's state).
                last_error = f"connect to {address}: {exc}"
                continue
            conn.request("POST", where.path, body=body, headers={**headers, "Connection": "close"})
            response = conn.getresponse()
            raw = response.read(MAX_BODY_BYTES)
            return answer(response.status, raw.decode("utf-8", "replace")[:EXCERPT_CHARS])
        except (OSError, http.client.HTTPException) as exc:
            # Connected: the receiver's own failure (its TLS, a timeout, a broken answer) is its to know.
            kind = "timed out" if isinstance(exc, TimeoutError | socket.timeout) else type(exc).__name__
            return answer(None, error=f"{kind}: {exc}")
        finally:
            conn.close()
    return answer(None, error=NO_ANSWER, detail=last_error or "no address could be connected to")
