"""A webhook receiver on 127.0.0.1, as a tenant would write one: verify, then drop duplicates.

A threaded ``http.server`` whose paths name endpoints (``/<name>``), each with its
secret: every request is verified with ``standardwebhooks.Webhook`` (signature
and timestamp tolerance), and a verified message whose ``webhook-id`` was seen
already is a duplicate (answered 200, not kept twice). Faults a test sets: answer
500 to the first N requests of each message, or hold the first requests for some seconds.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook


@dataclass
class Received:
    path: str
    webhook_id: str
    payload: dict[str, Any]
    headers: dict[str, str]
    at: float = 0.0  # time.time() of its arrival


@dataclass
class Receiver:
    secrets: dict[str, str] = field(default_factory=dict)  # path name -> secret
    fail_first: int = 0  # 500 to the first N requests of each webhook-id
    hold_seconds: float = 0.0  # answer the first hold_first requests only after this long
    hold_first: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)  # every request's headers (and path)
    unique: list[Received] = field(default_factory=list)  # verified, each webhook-id once
    rejected: list[str] = field(default_factory=list)  # why verification failed
    seen: dict[str, int] = field(default_factory=dict)  # requests per webhook-id
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/{name}"

    def events(self, name: str | None = None) -> list[tuple[str, str]]:
        """(event type, subject) of each unique message, of one endpoint or all."""
        with self.lock:
            return [
                (r.payload["type"], str(r.payload["data"].get("id", r.payload["data"].get("percent", ""))))
                for r in self.unique
                if name is None or r.path == name
            ]

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> int:
        name = path.strip("/").split("?", 1)[0]
        with self.lock:
            self.requests.append({**headers, ":path": name})
        secret = self.secrets.get(name)
        if secret is None:
            return 404
        try:
            payload = Webhook(secret).verify(body, headers)
        except Exception as exc:  # the library's WebhookVerificationError, and malformed input
            with self.lock:
                self.rejected.append(f"{type(exc).__name__}: {exc}")
            return 400
        webhook_id = headers["webhook-id"]
        with self.lock:
            self.seen[webhook_id] = count = self.seen.get(webhook_id, 0) + 1
            if count <= self.fail_first:
                return 500
            if all(r.webhook_id != webhook_id for r in self.unique):  # a duplicate is dropped
                self.unique.append(Received(name, webhook_id, payload, headers, time.time()))
        return 200


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            with receiver.lock:
                held = len(receiver.requests) < receiver.hold_first
            if held:
                time.sleep(receiver.hold_seconds)
            status = receiver.handle(self.path, headers, body)
            answer = json.dumps({"status": status}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def receiving(receiver: Receiver | None = None) -> Iterator[Receiver]:
    receiver = receiver or Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
