"""Per-IP limit_req zones through a real Nginx with known, small rates.

An Nginx of its own (fresh zones, its own access log) in front of the test
stack's gunicorn. Each test speaks from its own loopback address, so the
zones of one test never hold state another test depends on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from deploy import nginx as deploy_nginx
from tests.e2e.nginx_helpers import HSTS, PROBLEM_JSON, NginxInstance, client, start_nginx, wait_for_log
from tests.stack import TestStack as Stack

WRITE_BURST = 3  # 1r/s: a burst of 1 + 3 requests passes, then one a second.
LIMITS = {
    "TTS_NGINX_RATE_WRITE": "1r/s",
    "TTS_NGINX_BURST_WRITE": str(WRITE_BURST),
    "TTS_NGINX_RATE_LOGIN": "6r/m",
    "TTS_NGINX_BURST_LOGIN": "1",
    "TTS_NGINX_RATE_GENERAL": "50r/s",
    "TTS_NGINX_BURST_GENERAL": "100",
}


@pytest.fixture(scope="module")
def limited(web: Stack) -> Iterator[NginxInstance]:
    instance = start_nginx(web, "nginx-limits", env=LIMITS)
    try:
        yield instance
    finally:
        web.stop_service(instance.service)


def _warm(source: str, limited: NginxInstance) -> requests.Session:
    """A client whose TLS connection is already open (a GET does not count in the strict zone)."""
    session = client(source)
    assert session.get(limited.url("/healthz"), timeout=20).status_code in (200, 503)
    return session


def _burst(sessions: list[requests.Session], url: str, **kwargs: Any) -> list[requests.Response]:
    """All requests at once, each on its own warm connection."""
    with ThreadPoolExecutor(len(sessions)) as pool:
        return list(pool.map(lambda s: s.post(url, timeout=30, **kwargs), sessions))


def test_burst_of_writes_is_limited_per_address(limited: NginxInstance) -> None:
    url = limited.url("/api/v1/speech")
    first = [_warm("127.0.0.1", limited) for _ in range(10)]
    other = _warm("127.0.0.2", limited)
    responses = _burst([*first, other], url, json={"text": "hello"})
    mine, theirs = responses[:-1], responses[-1]

    passed = [r for r in mine if r.status_code != 429]
    limited_responses = [r for r in mine if r.status_code == 429]
    # 1 + burst pass at once; the rest of the burst is refused at the configured rate.
    assert len(passed) == 1 + WRITE_BURST, [r.status_code for r in mine]
    # The other address, at the same moment, is served.
    assert theirs.status_code != 429

    for response in limited_responses:
        assert response.headers["Content-Type"] == PROBLEM_JSON
        assert response.headers["Retry-After"] == "1"
        assert response.headers["Strict-Transport-Security"] == HSTS
        body = response.json()
        assert body["status"] == 429
        assert body["code"] == "rate_limited"
        assert body["type"].endswith("/rate_limited")

    # Spoofed forwarding headers do not make a new client: the limit is on the peer address.
    spoofed = first[0].post(
        url,
        json={"text": "hello"},
        headers={"X-Forwarded-For": "10.1.2.3", "X-Real-IP": "10.1.2.3", "Forwarded": "for=10.1.2.3"},
        timeout=30,
    )
    assert spoofed.status_code == 429

    # One leak interval later exactly one more request gets through.
    time.sleep(1.1)
    again = [first[0].post(url, json={"text": "hello"}, timeout=30).status_code for _ in range(2)]
    assert again[0] != 429 and again[1] == 429, again

    expected = len(limited_responses) + 2
    rejected = wait_for_log(
        limited, lambda e: e["status"] == 429 and e["remote_addr"] == "127.0.0.1", expected
    )
    assert len(rejected) == expected
    assert all(e["limit_req"] == "REJECTED" and e["upstream_time"] == "" for e in rejected)
    served = wait_for_log(limited, lambda e: e["remote_addr"] == "127.0.0.2" and e["method"] == "POST")
    assert served and served[0]["limit_req"] == "PASSED" and served[0]["upstream_status"] != ""


def test_reads_are_not_limited_by_the_strict_zone(limited: NginxInstance) -> None:
    session = _warm("127.0.0.3", limited)
    statuses = [
        session.get(limited.url("/api/v1/speech"), timeout=30).status_code for _ in range(2 * WRITE_BURST + 4)
    ]
    assert 429 not in statuses


def test_openai_endpoint_limit_uses_openai_error_shape(limited: NginxInstance) -> None:
    sessions = [_warm("127.0.0.4", limited) for _ in range(WRITE_BURST + 3)]
    responses = _burst(
        sessions, limited.url("/v1/audio/speech"), json={"model": "tts-1", "input": "hi", "voice": "alloy"}
    )
    refused = [r for r in responses if r.status_code == 429]
    # Two when the six land within a second; one when a slow host spreads them past it (a slot refilled,
    # seen once in a full run). What this test is about is the refusal's shape.
    assert 1 <= len(refused) <= 2, [r.status_code for r in responses]
    for response in refused:
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["Retry-After"] == "1"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "rate_limit_exceeded"


def test_voice_uploads_share_the_strict_zone(limited: NginxInstance) -> None:
    sessions = [_warm("127.0.0.5", limited) for _ in range(WRITE_BURST + 2)]
    responses = _burst(
        sessions, limited.url("/api/v1/voices"), files={"audio": ("a.wav", b"RIFF" + b"\0" * 64)}
    )
    assert [r.status_code for r in responses].count(429) == 1
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["Content-Type"] == PROBLEM_JSON


def test_login_pages_are_very_strict(limited: NginxInstance) -> None:
    sessions = [_warm("127.0.0.6", limited) for _ in range(4)]
    responses = _burst(sessions, limited.url("/accounts/login/"), data={"login": "a", "password": "b"})
    refused = [r for r in responses if r.status_code == 429]
    # 6r/m with burst 1: two attempts pass, the others wait 10 s.
    assert len(refused) == 2, [r.status_code for r in responses]
    for response in refused:
        assert response.headers["Retry-After"] == "10"
        assert response.headers["Content-Type"].startswith("text/html")
        assert response.headers["Strict-Transport-Security"] == HSTS
    # Showing the form is not an attempt.
    assert sessions[0].get(limited.url("/accounts/login/"), timeout=30).status_code != 429
    # The admin login shares the zone (same address, zone still full).
    assert sessions[0].post(limited.url("/admin/login/"), data={}, timeout=30).status_code == 429


def test_writes_with_an_api_key_pass_the_strict_zone(web: Stack) -> None:
    """Simultaneous requests from one backend with a key: Nginx's defaults let every one through."""
    defaults = {f"TTS_NGINX_{name}": value for name, value in deploy_nginx.DEFAULTS.items()}
    instance = start_nginx(web, "nginx-default-limits", env=defaults)
    try:
        sessions = [_warm("127.0.0.9", instance) for _ in range(12)]
        headers = {"Authorization": "Bearer tts_notakey0_x"}
        responses = _burst(sessions, instance.url("/v1/audio/speech"), json={"input": "hi"}, headers=headers)
        # Django answers each (401 for this key); Nginx refuses none.
        assert [r.status_code for r in responses] == [401] * 12
        # Without credentials the strict zone still applies.
        anonymous = _burst(
            [_warm("127.0.0.10", instance) for _ in range(12)], instance.url("/v1/audio/speech"), json={}
        )
        assert [r.status_code for r in anonymous].count(429) >= 5
        # Reads too: 60 at once with a key pass the general zone (burst 40), none without one is let past it.
        with ThreadPoolExecutor(60) as pool:
            keyed_reads = list(
                pool.map(
                    lambda _: client("127.0.0.11").get(
                        instance.url("/api/v1/usage"), headers=headers, timeout=30
                    ),
                    range(60),
                )
            )
        assert 429 not in [r.status_code for r in keyed_reads]
    finally:
        web.stop_service(instance.service)
