"""Realtime sessions (issue 53): ``WS /v1/audio/speech/stream`` through Nginx and TLS, a real worker behind.

Each test opens a socket with the ``websockets`` client, speaks through the tenant's key, and reads
what a voice agent would: events, binary audio, the close code. The rows it reads afterwards are
the ones the server committed (a live tenant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.api.conftest import Tenant
from tests.integration.api.session_client import closed, open_session, read_until, send
from tests.integration.api.session_client import Received as Got

pytestmark = pytest.mark.django_db(transaction=True)

VOICE = "piper:en_US-lessac-low"  # replaced below by a built-in voice the worker serves


@pytest.fixture
def tenant(live_tenant: Callable[..., Tenant], web: Any) -> Tenant:
    return live_tenant()


@pytest.fixture
def voice(builtin_voices: list[str]) -> str:
    piper = [v for v in builtin_voices if v.startswith("piper")]
    return piper[0] if piper else builtin_voices[0]


def port(web: Any) -> int:
    return int(web.cfg.https_port)


def test_it_replays_vllm_omnis_documented_exchange(tenant: Tenant, voice: str, web: Any) -> None:
    """vLLM-Omni's own sequence: config, text in pieces, input.done, then session.close."""
    with open_session(port(web), tenant.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": voice, "response_format": "pcm"})
        send(ws, {"type": "input.text", "text": "Hello, how are "})
        send(ws, {"type": "input.text", "text": "you today? I am fine"})
        send(ws, {"type": "input.done"})
        got = read_until(ws, Got(), lambda g: g.of("session.done"))
        send(ws, {"type": "session.close"})
        read_until(ws, got, closed)
    starts, dones = got.of("audio.start"), got.of("audio.done")
    assert [s["sentence_text"] for s in starts] == ["Hello, how are you today?", "I am fine"]
    assert [d["sentence_index"] for d in dones] == [0, 1]
    assert all(d["error"] is False for d in dones)
    assert sum(d["total_bytes"] for d in dones) == len(got.audio) > 0
    assert starts[0]["format"] == "pcm" and starts[0]["sample_rate"] == 24000
    (done,) = got.of("session.done")
    assert done["utterance_index"] == 0 and done["total_sentences"] == 2
    # Each unit's binary frames come between its audio.start and its audio.done.
    kinds = ["bytes" if isinstance(m, bytes) else m["type"] for m in got.order]
    first_audio = kinds.index("bytes")
    assert kinds[first_audio - 1] in ("audio.start", "bytes", "timestamps") and "audio.start" in kinds[:first_audio]
    assert got.close_code == 1000
    (closed_event,) = got.of("session.closed")
    assert closed_event["units"] == 2
    assert closed_event["charged_chars"] == sum(d["charged_chars"] for d in dones) > 0


def test_a_session_is_one_history_entry_and_one_webhook(tenant: Tenant, voice: str, web: Any) -> None:
    from webapp.speech.models import SpeechSession, SynthesisJob
    from webapp.webhooks.models import WebhookEndpoint, WebhookMessage

    WebhookEndpoint.objects.create(
        organization=tenant.org,
        url="https://hooks.example.test/in",
        secret="whsec_test",
        events=["job.succeeded", "job.failed", "job.canceled", "session.completed"],
    )
    with open_session(port(web), tenant.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": voice})
        send(ws, {"type": "input.text", "text": "One sentence here. And another one.", "flush": True})
        got = read_until(ws, Got(), lambda g: g.of("session.done"))
        send(ws, {"type": "session.close"})
        read_until(ws, got, closed)
    session = SpeechSession.objects.get(organization=tenant.org)
    assert session.status == "closed" and session.units == 2 and session.close_code == 1000
    assert SynthesisJob.objects.filter(session=session).count() == 2
    listed = tenant.client.get("/api/v1/speech").json()
    assert listed["results"] == []  # units are not history entries of their own
    messages = list(WebhookMessage.objects.filter(organization=tenant.org).values_list("event", "payload"))
    assert [event for event, _ in messages] == ["session.completed"]
    payload = messages[0][1]
    assert payload["data"]["id"] == str(session.id) if "data" in payload else payload["id"] == str(session.id)
