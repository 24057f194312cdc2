"""Nginx's own 502, 504 and connection-limit 429 under /api/ and /v1/ are JSON, never HTML.

A gunicorn + Nginx pair of this module's own: gunicorn is frozen (SIGSTOP) for
the 504 and stopped for the 502, which the shared `web` pair must not suffer.
Read timeouts are 1 s here so a hung upstream is a 504 quickly.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.e2e.nginx_helpers import HSTS, PROBLEM_JSON, NginxInstance, client, start_nginx
from tests.stack import CFG, side_gunicorn_env
from tests.stack import TestStack as Stack

FAULT_CFG = dataclasses.replace(CFG, var_dir=CFG.path("gunicorn-faults"))


@pytest.fixture(scope="module")
def pair(stack: Stack, django_db_setup: None) -> Iterator[tuple[Service, NginxInstance]]:
    FAULT_CFG.path("run").mkdir(parents=True, exist_ok=True)
    FAULT_CFG.gunicorn_socket.unlink(missing_ok=True)
    command = deploy_stack.gunicorn_command(FAULT_CFG, workers=1)
    gunicorn = stack.start_service(
        Service("gunicorn-faults", command, env=side_gunicorn_env("gunicorn-faults"))
    )
    deadline = time.monotonic() + 30
    while not FAULT_CFG.gunicorn_socket.exists():
        assert time.monotonic() < deadline, "gunicorn did not create its socket"
        time.sleep(0.1)
    nginx = start_nginx(
        stack,
        "nginx-faults",
        env={
            "TTS_NGINX_PROXY_READ_TIMEOUT": "1s",
            "TTS_NGINX_OPENAI_READ_TIMEOUT": "1s",
            "TTS_NGINX_CONN_PER_IP": "2",
        },
        overrides={"UPSTREAM": f"unix:{FAULT_CFG.gunicorn_socket}"},
    )
    # The first requests import Django's URL tree and open the database: slower than 1 s.
    deadline = time.monotonic() + 30
    while client("127.0.0.8").get(nginx.url("/api/v1/voices"), timeout=20).status_code == 504:
        assert time.monotonic() < deadline, "gunicorn never answered within the 1 s read timeout"
    try:
        yield gunicorn, nginx
    finally:
        assert gunicorn.process is not None
        if gunicorn.process.poll() is None:
            os.killpg(gunicorn.process.pid, signal.SIGCONT)
        stack.stop_service(nginx.service)
        stack.stop_service(gunicorn)


def _check_problem(response: requests.Response, status: int, code: str) -> None:
    assert response.status_code == status
    assert response.headers["Content-Type"] == PROBLEM_JSON
    assert response.headers["Strict-Transport-Security"] == HSTS
    body = response.json()
    assert body["status"] == status and body["code"] == code


def _check_openai(response: requests.Response, status: int, code: str) -> None:
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "server_error"


def test_hung_upstream_is_a_json_504_and_connections_are_limited(pair: tuple[Service, NginxInstance]) -> None:
    gunicorn, nginx = pair
    session = client("127.0.0.8")
    assert session.get(nginx.url("/api/v1/voices"), timeout=20).status_code != 504  # alive first
    assert gunicorn.process is not None
    os.killpg(gunicorn.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        _check_problem(session.get(nginx.url("/api/v1/voices"), timeout=20), 504, "upstream_timeout")
        assert time.monotonic() - started < 5  # the 1 s read timeout, not a default minute
        _check_problem(
            session.post(nginx.url("/api/v1/speech"), json={"text": "hi"}, timeout=20),
            504,
            "upstream_timeout",
        )
        _check_openai(
            session.post(
                nginx.url("/v1/audio/speech"),
                json={"model": "tts-1", "input": "hi", "voice": "alloy"},
                timeout=20,
            ),
            504,
            "upstream_timeout",
        )

        # Two requests hang in the upstream; a third from the same address is over limit_conn.
        with ThreadPoolExecutor(2) as pool:
            hanging = [
                pool.submit(client("127.0.0.9").get, nginx.url("/api/v1/usage"), timeout=20) for _ in range(2)
            ]
            time.sleep(0.4)
            third = client("127.0.0.9").get(nginx.url("/api/v1/usage"), timeout=20)
            assert third.status_code == 429
            assert third.headers["Content-Type"] == PROBLEM_JSON
            assert third.headers["Retry-After"] == "1"
            assert [f.result().status_code for f in hanging] == [504, 504]
        # Another address is not affected by that one's connections.
        assert client("127.0.0.10").get(nginx.url("/api/v1/usage"), timeout=20).status_code == 504
        # Requests with an API key count against the keyed flood guard (TTS_NGINX_CONN_PER_KEYED_IP),
        # not the strict limit: one customer's backend may hold many waiting requests.
        keyed = {"Authorization": "Bearer tts_notakey0_x"}
        with ThreadPoolExecutor(3) as pool:
            waits = [
                pool.submit(client("127.0.0.11").get, nginx.url("/api/v1/usage"), headers=keyed, timeout=20)
                for _ in range(3)
            ]
            assert [f.result().status_code for f in waits] == [504, 504, 504]
    finally:
        os.killpg(gunicorn.process.pid, signal.SIGCONT)


def test_stopped_upstream_is_a_json_502(stack: Stack, pair: tuple[Service, NginxInstance]) -> None:
    gunicorn, nginx = pair
    stack.stop_service(gunicorn)
    session = client("127.0.0.8")
    response = session.get(nginx.url("/api/v1/speech"), timeout=20)
    _check_problem(response, 502, "upstream_unavailable")
    assert response.headers["Retry-After"] == "5"
    _check_openai(session.get(nginx.url("/v1/models"), timeout=20), 502, "upstream_unavailable")
    # Static files do not need the application at all.
    assert session.get(nginx.url("/static/admin/css/base.css"), timeout=20).status_code != 502
