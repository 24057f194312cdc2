"""What the remote engine's tests share: two replicas of the fake vLLM-Omni server (tests/upstream),
processes of their own, per test module."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.upstream.harness import Upstream, prepare_clients, start_upstream

UPSTREAM_MODEL = "cosyvoice3"  # the model the replicas serve


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Upstream]]:
    prepare_clients()
    folder = tmp_path_factory.mktemp("upstreams")
    servers = [
        start_upstream(folder / f"{name}.log", "--replica", name, "--model", UPSTREAM_MODEL) for name in "ab"
    ]
    try:
        yield servers
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.stop()


def stream_through_nginx(web: Any, key: str, body: dict[str, Any]) -> tuple[float, float, bytes]:
    """``POST /v1/audio/speech`` through Nginx and TLS, read as it streams: (seconds to the first
    byte, seconds to the last, the body)."""
    started, first, audio = time.monotonic(), 0.0, bytearray()
    with requests.post(
        f"https://127.0.0.1:{web.cfg.https_port}/v1/audio/speech",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        stream=True,
        verify=False,
        timeout=60,
    ) as response:
        assert response.status_code == 200, response.text
        for chunk in response.iter_content(chunk_size=None):
            first = first or time.monotonic() - started
            audio += chunk
    return first, time.monotonic() - started, bytes(audio)
