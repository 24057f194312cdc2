"""The one API key a request or a WebSocket handshake carries, in any of the forms agents send.

Voice-agent SDKs send keys where their own services take them, and many cannot be told otherwise:

- ``Authorization: Bearer <key>`` (ours, OpenAI's) or ``Authorization: Token <key>`` (Deepgram's);
  the scheme is case-insensitive;
- an ``xi-api-key`` header (ElevenLabs');
- an ``xi-api-key`` query parameter (``xi_api_key`` too): a browser's WebSocket cannot set headers;
- a key in ``Sec-WebSocket-Protocol``, the one header a browser's WebSocket can set: the pair
  ``token, <key>`` (Deepgram's), or ``openai-insecure-api-key.<key>`` beside the client's own
  protocol such as ``realtime`` (OpenAI's browser clients).

One credential per request: two forms naming the same key are one credential, two different keys
are a ``MalformedCredential`` (which one was meant is a guess, and a guess would let a request
carrying a stranger's key and its own try both). A malformed ``Authorization`` header is one too.
An empty header counts as absent, as Nginx sees it (``$http_*`` is empty); a query parameter that
is there but empty is malformed, so nothing Nginx counts as a credential reaches Django as none
(nginx/nginx.conf.template, the map ``$tts_credentials``).

Pure functions on plain values: no Django, so the HTTP authentication, the per-key gate and the
session socket all read keys through this one module (the bottom layer, pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote_plus

# Where a credential came from (Credential.source).
BEARER = "bearer"
TOKEN = "token"
HEADER = "xi-api-key header"
QUERY = "xi-api-key query"
SUBPROTOCOL = "subprotocol"

AUTHORIZATION_SCHEMES = {"bearer": BEARER, "token": TOKEN}
KEY_HEADER = "xi-api-key"
QUERY_NAMES = ("xi-api-key", "xi_api_key")
# Deepgram's pair: the protocol "token", then the key as the next protocol.
TOKEN_PROTOCOL = "token"
# OpenAI's browser clients: the key after this prefix, beside their own protocol ("realtime").
OPENAI_KEY_PROTOCOL = "openai-insecure-api-key."

# A key-bearing query parameter in a logged URL, names compared as from_query compares them.
_LOGGED_QUERY_KEY = re.compile(r"([?&](?:xi-api-key|xi_api_key)=)[^&\s\"']*", re.IGNORECASE)
REDACTED = "REDACTED"

MALFORMED_AUTHORIZATION = "Malformed Authorization header; expected 'Bearer <api key>'."


@dataclass(frozen=True)
class Credential:
    """A key and where it was found; ``subprotocol``: what a WebSocket accept echoes (or None)."""

    token: str
    source: str
    subprotocol: str | None = None


class MalformedCredential(ValueError):
    """Credentials that are there but unusable; the message says why, for the client."""


def from_authorization(header: str) -> Credential | None:
    """``Bearer <key>`` or ``Token <key>``; None for an empty header."""
    if not header.strip():
        return None
    parts = header.split()
    scheme = AUTHORIZATION_SCHEMES.get(parts[0].lower()) if len(parts) == 2 else None
    if scheme is None:
        raise MalformedCredential(MALFORMED_AUTHORIZATION)
    return Credential(parts[1], scheme)


def from_key_header(value: str) -> Credential | None:
    value = value.strip()
    return Credential(value, HEADER) if value else None


def from_query(query_string: str) -> Credential | None:
    """``xi-api-key=<key>`` (or ``xi_api_key``); several equal values are one credential.

    Names are compared as sent, not percent-decoded: Nginx counts (and redacts from its log) the
    names it sees in ``$args``, so a name only Django would decode must not be a key here.
    """
    values = set()
    for pair in query_string.split("&"):
        name, equals, value = pair.partition("=")
        if equals and name.lower() in QUERY_NAMES:
            values.add(unquote_plus(value).strip())
    if not values:
        return None
    if "" in values:
        raise MalformedCredential("The xi-api-key query parameter is empty.")
    if len(values) > 1:
        raise MalformedCredential("More than one xi-api-key query parameter, with different keys.")
    return Credential(values.pop(), QUERY)


def protocol_to_echo(subprotocols: Sequence[str]) -> str | None:
    """The offered subprotocol a WebSocket accept names, or None when none was offered.

    A browser fails the handshake unless one of the protocols it offered comes back, so a socket
    that offered any gets one, refused or not (a refusal's close code reaches it only after an
    accepted handshake). Never the key when something else can do: Deepgram's ``token``; else the
    client's first protocol that carries no key (``realtime`` beside OpenAI's prefix); the
    key-bearing entry only when it was offered alone.
    """
    offered = [p.strip() for p in subprotocols if p.strip()]
    if not offered:
        return None
    tokens = [p for p in offered if p.lower() == TOKEN_PROTOCOL]
    if tokens:
        return tokens[0]
    others = [p for p in offered if not p.startswith(OPENAI_KEY_PROTOCOL)]
    return others[0] if others else offered[0]


def from_subprotocols(subprotocols: Sequence[str]) -> Credential | None:
    """A key among the offered WebSocket subprotocols (Deepgram's pair or OpenAI's prefix)."""
    offered = [p.strip() for p in subprotocols if p.strip()]
    tokens: set[str] = set()
    for index, protocol in enumerate(offered):
        if protocol.lower() == TOKEN_PROTOCOL:
            if index + 1 >= len(offered):
                raise MalformedCredential(
                    "Sec-WebSocket-Protocol 'token' must be followed by the API key ('token, <api key>')."
                )
            tokens.add(offered[index + 1])
        elif protocol.startswith(OPENAI_KEY_PROTOCOL):
            token = protocol[len(OPENAI_KEY_PROTOCOL) :]
            if not token:
                raise MalformedCredential(f"Sec-WebSocket-Protocol '{OPENAI_KEY_PROTOCOL}' has no API key.")
            tokens.add(token)
    if not tokens:
        return None
    if len(tokens) > 1:
        raise MalformedCredential("Sec-WebSocket-Protocol carries more than one API key.")
    return Credential(tokens.pop(), SUBPROTOCOL, protocol_to_echo(offered))


def credential_from(
    headers: Mapping[str, str], query_string: str = "", subprotocols: Sequence[str] = ()
) -> Credential | None:
    """The one credential of a request or handshake (``headers``: lower-case names), or None.

    Raises MalformedCredential for an unusable one, or for two that name different keys.
    """
    found = [
        credential
        for credential in (
            from_authorization(headers.get("authorization", "")),
            from_key_header(headers.get(KEY_HEADER, "")),
            from_query(query_string),
            from_subprotocols(subprotocols),
        )
        if credential is not None
    ]
    if not found:
        return None
    if len({c.token for c in found}) > 1:
        sources = ", ".join(c.source for c in found)
        raise MalformedCredential(f"More than one API key in one request ({sources}); send one.")
    # The same key twice (some SDKs send a header and a subprotocol) is one credential. Whatever
    # form it came in, a socket that offered protocols gets one back.
    return dataclasses.replace(found[0], subprotocol=protocol_to_echo(subprotocols))


def redact_query_keys(text: str) -> str:
    """``text`` (a log line or a path with its query) with each query key's value replaced by
    ``REDACTED``, as Nginx writes its access log."""
    return _LOGGED_QUERY_KEY.sub(rf"\g<1>{REDACTED}", text)


def headers_of_meta(meta: Mapping[str, object]) -> dict[str, str]:
    """The credential headers of a Django request's META (``HTTP_XI_API_KEY`` for ``xi-api-key``)."""
    return {
        "authorization": str(meta.get("HTTP_AUTHORIZATION", "") or ""),
        KEY_HEADER: str(meta.get("HTTP_XI_API_KEY", "") or ""),
    }


def credential_of_meta(meta: Mapping[str, object]) -> Credential | None:
    """The credential of an HTTP request (headers and query; subprotocols mean nothing over HTTP)."""
    return credential_from(headers_of_meta(meta), str(meta.get("QUERY_STRING", "") or ""))
