"""HTTP straight to gunicorn's Unix socket (the ASGI tier without Nginx in front).

The load tests talk to the web tier itself: Nginx's per-address flood guard
(one test client = one address) is not what they measure.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

from tests.stack import CFG


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def status_code(self) -> int:
        return self.status

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    web: Any, method: str, path: str, raw_key: str | None = None, body: Any = None, timeout: float = 180
) -> Answer:
    """One request on its own connection, as a separate client would make it."""
    conn = UnixHTTPConnection(str(CFG.gunicorn_socket), timeout)
    headers = {"Host": "localhost", "X-Forwarded-Proto": "https"}
    if raw_key:
        headers["Authorization"] = f"Bearer {raw_key}"
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()
