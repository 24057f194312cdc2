"""Credentials do not buy a way past the limits: a header is not a key.

A gunicorn + Nginx pair of this module's own: the Nginx has a strict general
zone (1 request a minute, burst 3, so a burst spread out by a busy machine lets
no more through), the gunicorn a small budget of failed authentications per
address (``TTS_AUTH_FAILURES_PER_IP``; the rest of the
suite runs with it off). Each test speaks from its own loopback address, so
neither the zones nor the budget of one test hold state another depends on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.e2e.nginx_helpers import PROBLEM_JSON, NginxInstance, client, start_nginx
from tests.stack import CFG, side_gunicorn_env
from tests.stack import TestStack as Stack

BUDGET = 4
PAIR_CFG = dataclasses.replace(CFG, var_dir=CFG.path("gunicorn-credentials"))
# Not a key of anyone's, in the shape of one (prefix of 8, then the secret).
FORGED = "Bearer tts_AAAAAAAA_" + "A" * 40
HEADERS = {"x": {"Authorization": "x"}, "forged": {"Authorization": FORGED}}


@pytest.fixture(scope="module")
def edge(stack: Stack, django_db_setup: None) -> Iterator[NginxInstance]:
    PAIR_CFG.path("run").mkdir(parents=True, exist_ok=True)
    PAIR_CFG.gunicorn_socket.unlink(missing_ok=True)
    env = side_gunicorn_env(
        "gunicorn-credentials", TTS_AUTH_FAILURES_PER_IP=str(BUDGET), TTS_AUTH_FAILURE_WINDOW_SECONDS="60"
    )
    command = deploy_stack.gunicorn_command(PAIR_CFG, workers=1)
    gunicorn = stack.start_service(Service("gunicorn-credentials", command, env=env))
    deadline = time.monotonic() + 30
    while not PAIR_CFG.gunicorn_socket.exists():
        assert time.monotonic() < deadline, "gunicorn did not create its socket"
        time.sleep(0.1)
    nginx = start_nginx(
        stack,
        "nginx-credentials",
        env={"TTS_NGINX_RATE_GENERAL": "1r/m", "TTS_NGINX_BURST_GENERAL": "3"},
        overrides={"UPSTREAM": f"unix:{PAIR_CFG.gunicorn_socket}"},
    )
    try:
        yield nginx
    finally:
        stack.stop_service(nginx.service)
        stack.stop_service(gunicorn)


def _at_once(source: str, url: str, headers: dict[str, str], count: int) -> list[int]:
    """``count`` GETs at the same moment from ``source``, each on its own connection."""
    sessions = [client(source) for _ in range(count)]
    with ThreadPoolExecutor(count) as pool:
        return [
            r.status_code
            for r in pool.map(
                lambda s: s.get(url, headers=headers, timeout=30, allow_redirects=False), sessions
            )
        ]


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("/app/account/", "127.0.2.1"),
        ("/api/v1/schema", "127.0.2.2"),
        ("/api/docs", "127.0.2.3"),
        ("/", "127.0.2.4"),
    ],
)
@pytest.mark.parametrize("header", ["x", "forged"])
def test_pages_and_the_schema_stay_in_the_anonymous_zone_whatever_the_header(
    edge: NginxInstance, path: str, source: str, header: str
) -> None:
    source = source + ("0" if header == "x" else "1")  # 127.0.2.10 / .11, ...: one address per case
    statuses = _at_once(source, edge.url(path), HEADERS[header], 12)
    # 1 + burst 3 pass; the other 8 are refused by Nginx, as without a header.
    assert statuses.count(429) == 8, statuses


@pytest.mark.parametrize(("header", "source"), [("x", "127.0.3.1"), ("forged", "127.0.3.2")])
def test_an_address_whose_credentials_keep_failing_is_refused_for_a_while(
    edge: NginxInstance, header: str, source: str
) -> None:
    session = client(source)
    url = edge.url("/api/v1/usage")
    statuses = [session.get(url, headers=HEADERS[header], timeout=30).status_code for _ in range(BUDGET + 3)]
    # The API zone lets credentials through (a backend behind one address); Django counts the failures.
    assert statuses == [401] * BUDGET + [429] * 3, statuses
    refused = session.get(url, headers=HEADERS[header], timeout=30)
    assert refused.status_code == 429
    assert refused.headers["Content-Type"] == PROBLEM_JSON
    assert refused.json()["code"] == "too_many_auth_failures"
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    # The other header on the same address is refused too (the budget is the address's) ...
    other = next(value for name, value in HEADERS.items() if name != header)
    assert session.get(url, headers=other, timeout=30).status_code == 429
    # ... another address is not, and the same address without credentials gets the plain 401.
    assert client(source[:-1] + "9").get(url, headers=HEADERS[header], timeout=30).status_code == 401
    assert session.get(url, timeout=30).status_code == 401
    # The OpenAI surface shares the budget.
    assert (
        session.post(edge.url("/v1/audio/speech"), headers=HEADERS[header], json={}, timeout=30).status_code
        == 429
    )


def test_failures_are_not_refused_below_the_budget_from_many_requests_at_once(edge: NginxInstance) -> None:
    """The API zone (keyed) still lets a burst with credentials through Nginx: each reaches Django."""
    statuses = _at_once("127.0.3.5", edge.url("/api/v1/usage"), HEADERS["forged"], 3)
    assert statuses == [401] * 3


@pytest.mark.django_db(transaction=True)
def test_a_valid_key_is_never_refused_because_others_failed_from_its_address(edge: NginxInstance) -> None:
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    org = create_organization("Behind The Same NAT")
    _key, secret = create_api_key(org, "backend", created_by=OPERATOR)
    session = client("127.0.3.7")
    url = edge.url("/api/v1/usage")
    statuses = [
        session.get(url, headers=HEADERS["forged"], timeout=30).status_code for _ in range(BUDGET + 1)
    ]
    assert statuses == [401] * BUDGET + [429], statuses  # the stranger spent the address's budget
    valid = session.get(url, headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert valid.status_code == 200, valid.text  # the tenant's key behind the same address still works
    # Failures from the address are still throttled, the valid key's success does not reset them.
    assert session.get(url, headers=HEADERS["forged"], timeout=30).status_code == 429
    assert session.get(url, headers=HEADERS["x"], timeout=30).status_code == 429
