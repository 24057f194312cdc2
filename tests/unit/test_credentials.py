"""webapp/credentials.py: every form of API key agents send, and what is refused as malformed."""

from __future__ import annotations

import pytest

from webapp import credentials as c
from webapp.credentials import Credential, MalformedCredential, credential_from, credential_of_meta

KEY = "tts_AbCdEfGh_" + "s3cret-_" * 5
OTHER = "tts_ZzZzZzZz_" + "other" * 8


@pytest.mark.parametrize(
    ("headers", "query", "protocols", "expected"),
    [
        ({"authorization": f"Bearer {KEY}"}, "", (), Credential(KEY, c.BEARER)),
        ({"authorization": f"bearer {KEY}"}, "", (), Credential(KEY, c.BEARER)),
        ({"authorization": f"BEARER   {KEY}  "}, "", (), Credential(KEY, c.BEARER)),
        ({"authorization": f"Token {KEY}"}, "", (), Credential(KEY, c.TOKEN)),
        ({"authorization": f"token {KEY}"}, "", (), Credential(KEY, c.TOKEN)),
        ({"xi-api-key": KEY}, "", (), Credential(KEY, c.HEADER)),
        ({"xi-api-key": f" {KEY} "}, "", (), Credential(KEY, c.HEADER)),
        ({}, f"xi-api-key={KEY}", (), Credential(KEY, c.QUERY)),
        ({}, f"model=x&xi_api_key={KEY}&voice=y", (), Credential(KEY, c.QUERY)),
        ({}, f"XI-API-KEY={KEY}", (), Credential(KEY, c.QUERY)),
        ({}, f"xi-api-key={KEY}&xi_api_key={KEY}", (), Credential(KEY, c.QUERY)),
        ({}, "", ("token", KEY), Credential(KEY, c.SUBPROTOCOL, "token")),
        ({}, "", ("Token", KEY), Credential(KEY, c.SUBPROTOCOL, "Token")),
        (
            {},
            "",
            ("realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1"),
            Credential(KEY, c.SUBPROTOCOL, "realtime"),
        ),
        (
            {},
            "",
            (f"openai-insecure-api-key.{KEY}", "realtime"),
            Credential(KEY, c.SUBPROTOCOL, "realtime"),
        ),
        # Offered alone, the key-bearing protocol is the only one a browser accepts back.
        (
            {},
            "",
            (f"openai-insecure-api-key.{KEY}",),
            Credential(KEY, c.SUBPROTOCOL, f"openai-insecure-api-key.{KEY}"),
        ),
        # The same key twice is one credential; a socket that offered protocols gets one back.
        (
            {"authorization": f"Bearer {KEY}", "xi-api-key": KEY},
            f"xi-api-key={KEY}",
            ("token", KEY),
            Credential(KEY, c.BEARER, "token"),
        ),
        ({"authorization": f"Bearer {KEY}"}, "", ("realtime",), Credential(KEY, c.BEARER, "realtime")),
        ({}, f"xi-api-key={KEY}", ("a", "b"), Credential(KEY, c.QUERY, "a")),
        # Percent-encoded names are not ours (Nginx would neither count nor redact them).
        ({}, f"xi%2Dapi%2Dkey={KEY}", (), None),
        ({}, f"xi-api-key={KEY.replace('_', '%5F')}", (), Credential(KEY, c.QUERY)),
        ({"authorization": f"Bearer {KEY}", "xi-api-key": KEY}, "", (), Credential(KEY, c.BEARER)),
    ],
)
def test_each_form_gives_the_key(
    headers: dict[str, str], query: str, protocols: tuple[str, ...], expected: Credential | None
) -> None:
    assert credential_from(headers, query, protocols) == expected


@pytest.mark.parametrize(
    ("headers", "query", "protocols"),
    [
        ({}, "", ()),
        ({"authorization": ""}, "", ()),
        ({"authorization": "   "}, "", ()),
        ({"xi-api-key": ""}, "", ()),
        ({}, "model=x&voice=y", ()),
        ({}, "api_key=x", ()),
        ({}, "", ("realtime",)),
        ({}, "", ("realtime", "openai-beta.realtime-v1")),
    ],
)
def test_no_credential(headers: dict[str, str], query: str, protocols: tuple[str, ...]) -> None:
    assert credential_from(headers, query, protocols) is None


@pytest.mark.parametrize(
    ("headers", "query", "protocols", "says"),
    [
        ({"authorization": "Bearer"}, "", (), "expected 'Bearer <api key>'"),
        ({"authorization": "Bearer a b"}, "", (), "expected 'Bearer <api key>'"),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "", (), "expected 'Bearer <api key>'"),
        ({"authorization": KEY}, "", (), "expected 'Bearer <api key>'"),
        ({}, "xi-api-key=", (), "empty"),
        ({}, "xi_api_key=%20", (), "empty"),
        ({}, f"xi-api-key={KEY}&xi-api-key={OTHER}", (), "different keys"),
        ({}, "", ("realtime", "token"), "'token, <api key>'"),
        ({}, "", ("openai-insecure-api-key.", "realtime"), "has no API key"),
        (
            {},
            "",
            (f"openai-insecure-api-key.{KEY}", f"openai-insecure-api-key.{OTHER}"),
            "more than one API key",
        ),
        ({}, "", ("token", KEY, f"openai-insecure-api-key.{OTHER}"), "more than one API key"),
        ({"authorization": f"Bearer {KEY}", "xi-api-key": OTHER}, "", (), "bearer, xi-api-key header"),
        ({"authorization": f"Token {KEY}"}, f"xi-api-key={OTHER}", (), "token, xi-api-key query"),
        ({"xi-api-key": KEY}, "", ("token", OTHER), "xi-api-key header, subprotocol"),
    ],
)
def test_malformed_and_ambiguous_credentials_are_refused_with_a_reason(
    headers: dict[str, str], query: str, protocols: tuple[str, ...], says: str
) -> None:
    with pytest.raises(MalformedCredential) as raised:
        credential_from(headers, query, protocols)
    assert says in str(raised.value)


def test_a_malformed_authorization_keeps_the_apis_message() -> None:
    with pytest.raises(MalformedCredential) as raised:
        credential_from({"authorization": "Basic x"})
    assert str(raised.value) == "Malformed Authorization header; expected 'Bearer <api key>'."


def test_http_requests_read_headers_and_query_but_never_subprotocols() -> None:
    assert credential_of_meta({"HTTP_AUTHORIZATION": f"Token {KEY}"}) == Credential(KEY, c.TOKEN)
    assert credential_of_meta({"HTTP_XI_API_KEY": KEY}) == Credential(KEY, c.HEADER)
    assert credential_of_meta({"QUERY_STRING": f"xi-api-key={KEY}"}) == Credential(KEY, c.QUERY)
    assert credential_of_meta({"HTTP_SEC_WEBSOCKET_PROTOCOL": f"token, {KEY}"}) is None
    assert credential_of_meta({}) is None


@pytest.mark.parametrize(
    ("offered", "echo"),
    [
        ((), None),
        (("realtime",), "realtime"),
        (("token", KEY), "token"),
        (("x", "token", KEY), "token"),
        (("realtime", f"openai-insecure-api-key.{KEY}"), "realtime"),
        ((f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1"), "openai-beta.realtime-v1"),
        ((f"openai-insecure-api-key.{KEY}",), f"openai-insecure-api-key.{KEY}"),
        (("token",), "token"),  # malformed, yet a refusal still needs a protocol back to be read
    ],
)
def test_the_protocol_an_accept_echoes_is_one_offered_and_not_the_key_when_avoidable(
    offered: tuple[str, ...], echo: str | None
) -> None:
    assert c.protocol_to_echo(offered) == echo


def test_credentials_are_frozen_values() -> None:
    credential = Credential(KEY, c.BEARER)
    with pytest.raises(AttributeError):
        credential.token = OTHER  # type: ignore[misc]
    assert credential.subprotocol is None


@pytest.mark.parametrize(
    ("logged", "written"),
    [
        (f"/v1/audio/speech/stream?xi-api-key={KEY}", "/v1/audio/speech/stream?xi-api-key=REDACTED"),
        (
            f'GET /v1/models?a=1&XI_API_KEY={KEY}&b=2 HTTP/1.1" 200',
            'GET /v1/models?a=1&XI_API_KEY=REDACTED&b=2 HTTP/1.1" 200',
        ),
        (f"/a?xi_api_key={KEY}&xi-api-key={OTHER}", "/a?xi_api_key=REDACTED&xi-api-key=REDACTED"),
        (f"/a?not-xi-api-key={KEY}", f"/a?not-xi-api-key={KEY}"),  # not a parameter the app reads
    ],
)
def test_a_query_key_is_redacted_from_what_is_logged(logged: str, written: str) -> None:
    assert c.redact_query_keys(logged) == written
