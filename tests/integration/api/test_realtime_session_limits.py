"""Realtime sessions' limits and ends (issue 53): a gunicorn of the module's own with tight limits.

The limits are settings of the web process, so these tests talk straight to a gunicorn started with
them (tests.stack.tcp_gunicorn: the real worker class and WebSocket protocol, over TCP as the
Kubernetes edge reaches web); the protocol itself goes through Nginx in test_realtime_sessions.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from tests.integration.api.conftest import Tenant
from tests.integration.api.session_client import Received as Got
from tests.integration.api.session_client import closed, open_plain, read_until, send
from tests.stack import TestStack, tcp_gunicorn

pytestmark = pytest.mark.django_db(transaction=True)

TIGHT = {
    "TTS_SESSION_SEND_TIMEOUT_SECONDS": "2",
    "TTS_SESSION_IDLE_SECONDS": "3",
    "TTS_SESSION_MESSAGES_PER_SECOND": "30",
    "TTS_SESSION_BUFFER_CHARS": "300",
    "TTS_SESSIONS_PER_KEY": "2",
}


@pytest.fixture(scope="module")
def tight(stack: TestStack, django_db_setup: None) -> Iterator[int]:
    with tcp_gunicorn(stack, "gunicorn-sessions", **TIGHT) as port:
        yield port


@pytest.fixture
def tenant(live_tenant: Callable[..., Tenant]) -> Tenant:
    return live_tenant()


def configured(port: int, tenant: Tenant, voice: str, **config: Any) -> Any:
    ws = open_plain(port, tenant.raw_key)
    send(ws, {"type": "session.config", "voice": voice, **config})
    read_until(ws, Got(), lambda g: g.of("session.ready"), timeout=20)
    return ws


def test_it_closes_without_a_key_with_4401(tight: int, tenant: Tenant) -> None:
    ws = open_plain(tight, None)
    got = read_until(ws, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4401, "unauthenticated")


def test_it_closes_a_first_message_that_is_not_a_config_with_4400(tight: int, tenant: Tenant) -> None:
    ws = open_plain(tight, tenant.raw_key)
    send(ws, {"type": "input.text", "text": "Hello."})
    got = read_until(ws, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4400, "invalid_request")


def test_it_closes_a_config_naming_an_unknown_voice_with_4400(tight: int, tenant: Tenant) -> None:
    ws = open_plain(tight, tenant.raw_key)
    send(ws, {"type": "session.config", "voice": "nobody:nothing"})
    got = read_until(ws, Got(), closed, timeout=10)
    assert got.close_code == 4400 and got.close_reason in ("unknown_voice", "invalid_request")


def test_bad_messages_get_error_events_and_the_session_goes_on(
    tight: int, tenant: Tenant, voice: str
) -> None:
    ws = configured(tight, tenant, voice)
    ws.send(b"\x00\x01")
    send(ws, {"type": "input.shout", "text": "x"})
    ws.send("not json")
    send(ws, {"type": "input.text", "text": "x" * 400})  # over the 300 buffered characters
    send(ws, {"type": "context.close", "context_id": "a"})  # never opened
    send(ws, {"type": "input.text", "text": "Fine. ", "context_id": "b"})
    send(ws, {"type": "context.close", "context_id": "b"})
    send(ws, {"type": "input.text", "text": "Again.", "context_id": "b"})  # reused after its close
    got = read_until(ws, Got(), lambda g: len(g.of("error")) >= 6, timeout=30)
    codes = [e["code"] for e in got.of("error")]
    assert codes == [
        "invalid_request",
        "invalid_request",
        "invalid_request",
        "session_limit",
        "invalid_request",
        "invalid_request",
    ]
    assert "Binary frames" in got.of("error")[0]["message"]
    assert "closed" in got.of("error")[5]["message"]
    send(ws, {"type": "input.text", "text": "Still here.", "flush": True})
    got = read_until(
        ws,
        got,
        lambda g: (
            g.of("session.done") and any(d.get("context_id") == "default" for d in g.of("session.done"))
        ),
    )
    assert any(s["sentence_text"] == "Still here." for s in got.of("audio.start"))
    ws.close()


def test_a_key_holds_at_most_its_sessions(tight: int, tenant: Tenant, voice: str) -> None:
    first, second = configured(tight, tenant, voice), configured(tight, tenant, voice)
    third = open_plain(tight, tenant.raw_key)
    got = read_until(third, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4429, "too_many_sessions")
    first.close()
    second.close()


def test_an_idle_session_is_closed(tight: int, tenant: Tenant, voice: str) -> None:
    ws = configured(tight, tenant, voice)
    started = time.monotonic()
    got = read_until(ws, Got(), closed, timeout=15)
    assert got.close_code == 1000 and got.close_reason == "idle"
    assert 3 <= time.monotonic() - started < 8


def test_idle_counts_from_the_last_audio_not_the_last_text(
    stack: TestStack, tight: int, tenant: Tenant, voice: str
) -> None:
    worker = stack.ensure_session_worker()
    assert worker.process is not None
    ws = configured(tight, tenant, voice, cache=False)
    # The worker frozen for 4 s: the unit's audio comes after the 3 s idle timeout, counted from the
    # text, has passed (an engine that slow, or a queue that long).
    os.killpg(worker.process.pid, signal.SIGSTOP)
    try:
        send(ws, {"type": "input.text", "text": "This answer comes late.", "flush": True})
        sent = time.monotonic()
        time.sleep(4)
    finally:
        os.killpg(worker.process.pid, signal.SIGCONT)
    got = read_until(ws, Got(), lambda g: g.of("session.done"), timeout=60)
    done = time.monotonic()
    assert done - sent > 3 and got.audio
    got = read_until(ws, got, closed, timeout=15)
    assert got.close_code == 1000 and got.close_reason == "idle"
    assert time.monotonic() - done >= 2  # 3 s after the last audio, less a watch tick


def test_a_flood_of_messages_closes_the_session_with_4429(tight: int, tenant: Tenant, voice: str) -> None:
    ws = configured(tight, tenant, voice)
    for _ in range(40):
        send(ws, {"type": "ping"})
    got = read_until(ws, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4429, "session_limit")


def test_a_revoked_key_closes_the_session_within_a_second(tight: int, tenant: Tenant, voice: str) -> None:
    from webapp.tenants.services import OPERATOR, revoke_api_key

    ws = configured(tight, tenant, voice)
    revoke_api_key(tenant.key, by=OPERATOR)
    revoked = time.monotonic()
    got = read_until(ws, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4401, "unauthenticated")
    assert time.monotonic() - revoked < 1.5  # a second, and the close's way back


def test_an_exhausted_quota_closes_the_session(
    tight: int, live_tenant: Callable[..., Tenant], voice: str
) -> None:
    tenant = live_tenant(monthly_characters=30)
    ws = configured(tight, tenant, voice)
    send(ws, {"type": "input.text", "text": "This first sentence fits. ", "flush": False})
    send(
        ws,
        {
            "type": "input.text",
            "text": "This second one is past the month's thirty characters.",
            "flush": True,
        },
    )
    got = read_until(ws, Got(), closed, timeout=30)
    assert got.close_code == 4429 and got.close_reason == "quota_exceeded"


def test_a_client_that_stops_reading_is_disconnected(tight: int, tenant: Tenant, voice: str) -> None:
    from webapp.speech.models import SpeechSession, SynthesisJob

    # A client that reads nothing: a small receive window, and the library's reader thread stops after
    # one queued frame. The server's own send buffer is the kernel's to size (4 MiB here, more on
    # some hosts), so the test does not count on one text's audio outgrowing it: it keeps offering
    # text (slow, 48 kHz: about 1.6 MB of audio per message), which the session takes whenever its
    # queue has room, until the server's send has waited its 2 s and it drops the connection.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.connect(("127.0.0.1", tight))
    ws = open_plain(tight, tenant.raw_key, sock=sock, max_queue=1)
    send(ws, {"type": "session.config", "voice": voice, "sample_rate": 48000, "speed": 0.5})
    read_until(ws, Got(), lambda g: g.of("session.ready"), timeout=20)
    long = " ".join(f"Sentence number {n} goes on for a while, so its audio is long." for n in range(4))
    assert len(long) < 300  # under the tight buffer: each offer fits once the queue has drained
    deadline, row = time.monotonic() + 40, None
    while time.monotonic() < deadline:
        row = SpeechSession.objects.filter(organization=tenant.org).values("status", "close_code").first()
        if row and row["status"] == "closed":
            break
        with contextlib.suppress(ConnectionClosed):
            send(ws, {"type": "input.text", "text": long, "flush": True})  # input keeps it from idling
        time.sleep(0.5)
    assert row is not None and row["status"] == "closed"
    reason = SpeechSession.objects.filter(organization=tenant.org).values_list("close_reason", flat=True)
    assert (row["close_code"], reason.get()) == (1006, "client_not_reading")
    assert SynthesisJob.objects.filter(session__organization=tenant.org).exists()
    ws.close()


def test_on_sigterm_a_session_finishes_its_unit_and_closes_with_1012(
    stack: TestStack, tenant: Tenant, voice: str, django_db_setup: None
) -> None:
    with tcp_gunicorn(stack, "gunicorn-draining") as port:
        ws = configured(port, tenant, voice)
        text = "This unit is long enough to be playing when the server is told to stop, and it goes on. "
        send(ws, {"type": "input.text", "text": text * 2, "flush": True})
        got = read_until(ws, Got(), lambda g: g.frames)
        master = _gunicorn_master(port)
        os.kill(master, signal.SIGTERM)
        got = read_until(ws, got, closed, timeout=30)
    assert got.close_code == 1012
    dones = got.of("audio.done")
    assert dones and dones[0]["error"] is False and dones[0].get("cleared") is not True
    assert dones[0]["total_bytes"] > 0


def test_on_sigterm_an_idle_session_closes_with_1012_at_once(
    stack: TestStack, tenant: Tenant, voice: str, django_db_setup: None
) -> None:
    """Nothing to send when the drain comes: the session closes at once, not when gunicorn's
    graceful timeout (20 s) cuts the connection."""
    with tcp_gunicorn(stack, "gunicorn-draining-idle") as port:
        ws = configured(port, tenant, voice)
        send(ws, {"type": "input.text", "text": "Short.", "flush": True})
        got = read_until(ws, Got(), lambda g: g.of("session.done"))
        os.kill(_gunicorn_master(port), signal.SIGTERM)
        told = time.monotonic()
        got = read_until(ws, got, closed, timeout=30)
    assert (got.close_code, got.close_reason) == (1012, "server_restart")
    assert time.monotonic() - told < 5, time.monotonic() - told


def _gunicorn_master(port: int) -> int:
    import psutil

    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            proc = psutil.Process(conn.pid)
            parent = proc.parent()
            return parent.pid if parent is not None and "gunicorn" in " ".join(parent.cmdline()) else proc.pid
    raise AssertionError(f"no gunicorn listens on {port}")


def test_a_full_interactive_lane_refuses_a_new_session_at_once_with_4429(
    tight: int, tenant: Tenant, voice: str, full_lane: None
) -> None:
    ws = open_plain(tight, tenant.raw_key)
    sent = time.monotonic()
    send(ws, {"type": "session.config", "voice": voice})
    got = read_until(ws, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4429, "interactive_lane_full")
    assert time.monotonic() - sent < 1.0  # at once, not after the waiting units


def test_a_full_interactive_lane_refuses_a_new_context_and_the_session_goes_on(
    tight: int, tenant: Tenant, voice: str, request: pytest.FixtureRequest
) -> None:
    ws = configured(tight, tenant, voice)
    send(ws, {"type": "input.text", "text": "First context.", "context_id": "a", "flush": True})
    got = read_until(ws, Got(), lambda g: g.of("session.done"), timeout=60)
    request.getfixturevalue("full_lane")
    send(ws, {"type": "input.text", "text": "Second context.", "context_id": "b", "flush": True})
    send(ws, {"type": "ping"})
    got = read_until(ws, got, lambda g: g.of("pong") or closed(g), timeout=10)
    (error,) = got.of("error")
    assert (error["code"], error["status"], error["context_id"]) == ("interactive_lane_full", 429, "b")
    assert not closed(got)  # the session and its first context go on
    ws.close()
