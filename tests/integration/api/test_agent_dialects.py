"""Agents connect unchanged (issue 55): ElevenLabs' and Deepgram's streaming dialects on the session core.

The first tests drive the real clients, unmodified, as processes of their own virtualenv
(tests/clients): the official ``elevenlabs`` SDK's stream-input client, Pipecat's
``ElevenLabsTTSService`` (multi-stream-input) and Pipecat's ``DeepgramTTSService`` (/v1/speak),
each pointed at this service's Nginx over TLS. Each speaks a text, is interrupted once, and speaks
again. The others speak each dialect with the ``websockets`` client to pin what the clients do
not show: message shapes, errors in each dialect's own shape, billing and the session's row.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.api.conftest import Tenant
from tests.integration.api.conftest import https_port as port
from tests.integration.api.session_client import Received as Got
from tests.integration.api.session_client import closed, open_session, read_until, send

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[3]
CLIENT = ROOT / "tests" / "clients" / "agent_client.py"
TEXT = "Thanks for calling. Your order ships tomorrow morning."
LONG = (
    "Let me read you the whole policy. Returns are accepted within thirty days of delivery. "
    "Items must be unused and in their original packaging. Refunds go back to the card you paid "
    "with, within five business days. Shipping costs are not refunded unless the item was faulty."
)
AFTER = "Sorry, go ahead."
RATE = 24000


@pytest.fixture
def tenant(live_tenant: Callable[..., Tenant], web: Any) -> Tenant:
    return live_tenant()


def run_client(python: Path, name: str, web: Any, tenant: Tenant, voice: str) -> dict[str, Any]:
    env = {
        **os.environ,
        # The clients verify TLS as they would against the real services: the stack's certificate.
        "SSL_CERT_FILE": str(web.cfg.path("tls", "cert.pem")),
    }
    args = [str(python), str(CLIENT), name, "--base-url", f"https://127.0.0.1:{port(web)}"]
    args += ["--key", tenant.raw_key, "--voice", voice, "--text", TEXT, "--long", LONG, "--after", AFTER]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, cwd="/")
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def session_rows(tenant: Tenant) -> list[Any]:
    from webapp.speech.models import SpeechSession

    return list(SpeechSession.objects.filter(organization_id=tenant.org.pk).order_by("created_at"))


def unit_chars(session: Any) -> int:
    from webapp.speech.models import SynthesisJob

    return sum(SynthesisJob.objects.filter(session=session).values_list("text_chars", flat=True))


def seconds(pcm_bytes: int, rate: int = RATE) -> float:
    return pcm_bytes / 2 / rate


def assert_spoken(audio_bytes: int, text: str) -> None:
    """Audio of a plausible length for the text (Piper speaks about 13-18 characters a second)."""
    length = seconds(audio_bytes)
    assert len(text) / 30 < length < len(text) / 6, (length, len(text))


def assert_charged_less_than_sent(session: Any) -> None:
    """The long text's audio past the interruption never reached the client, and is not charged."""
    assert session.charged_chars < session.received_chars, (session.charged_chars, session.received_chars)


# ----------------------------------------------------------------------------- real clients


def test_the_elevenlabs_sdk_streams_through_stream_input(
    clients_python: Path, tenant: Tenant, voice: str, web: Any
) -> None:
    got = run_client(clients_python, "elevenlabs-sdk", web, tenant, voice)
    assert_spoken(got["whole_bytes"], TEXT)
    assert got["whole_bytes"] % 2 == 0  # 16-bit PCM
    assert 0 < got["interrupted_bytes"] < seconds_to_bytes(len(LONG) / 30)
    # ulaw_8000: one byte a sample at 8 kHz.
    assert len(AFTER) / 30 < got["after_bytes"] / 8000 < len(AFTER) / 6
    rows = session_rows(tenant)
    assert [r.protocol for r in rows] == ["elevenlabs"] * 3
    assert rows[0].close_code == 1000 and rows[2].close_code == 1000
    assert rows[0].charged_chars == unit_chars(rows[0]) > len(TEXT) - 3  # every unit, whole
    assert rows[1].charged_chars < len(LONG)  # the client left after its first audio


def seconds_to_bytes(s: float, rate: int = RATE) -> int:
    return int(s * rate * 2)


def test_pipecats_elevenlabs_service_speaks_and_is_interrupted(
    clients_python: Path, tenant: Tenant, voice: str, web: Any
) -> None:
    got = run_client(clients_python, "pipecat-elevenlabs", web, tenant, voice)
    assert got["errors"] == []
    assert_spoken(got["whole_bytes"], TEXT)
    assert got["interrupted_bytes"] > 0 and got["after_interruption_bytes"] == 0
    assert_spoken(got["after_bytes"], AFTER)
    (row,) = session_rows(tenant)
    assert row.protocol == "elevenlabs" and row.contexts == 3
    assert_charged_less_than_sent(row)


def test_pipecats_deepgram_service_speaks_and_is_interrupted(
    clients_python: Path, tenant: Tenant, voice: str, web: Any
) -> None:
    got = run_client(clients_python, "pipecat-deepgram", web, tenant, voice)
    assert got["errors"] == []
    assert_spoken(got["whole_bytes"], TEXT)
    assert got["interrupted_bytes"] > 0 and got["after_interruption_bytes"] == 0
    assert_spoken(got["after_bytes"], AFTER)
    (row,) = session_rows(tenant)
    assert row.protocol == "deepgram"
    assert_charged_less_than_sent(row)


# ----------------------------------------------------------------------------- ElevenLabs' wire


def eleven_path(voice: str, multi: bool = False, **query: str) -> str:
    kind = "multi-stream-input" if multi else "stream-input"
    params = "&".join(f"{k}={v}" for k, v in {"output_format": "pcm_24000", **query}.items())
    return f"/v1/text-to-speech/{voice}/{kind}?{params}"


def eleven_open(web: Any, tenant: Tenant, path: str) -> Any:
    return open_session(port(web), None, path=path, headers={"xi-api-key": tenant.raw_key})


def test_stream_input_sends_base64_audio_and_alignment_then_isfinal_and_closes_1000(
    tenant: Tenant, voice: str, web: Any
) -> None:
    with eleven_open(web, tenant, eleven_path(voice)) as ws:
        send(ws, {"text": " ", "generation_config": {"chunk_length_schedule": [50]}})
        send(ws, {"text": "Hello there, how are you today? "})
        send(ws, {"text": ""})
        got = read_until(ws, Got(), closed)
    messages = [e for _, e in got.events]
    audio = [m for m in messages if m.get("audio")]
    pcm = b"".join(base64.b64decode(m["audio"]) for m in audio)
    assert_spoken(len(pcm), "Hello there, how are you today?")
    assert all(m["isFinal"] is None for m in audio)
    aligned = [m for m in messages if m.get("alignment")]
    assert aligned, messages[:3]
    alignment = aligned[0]["alignment"]
    assert alignment == aligned[0]["normalizedAlignment"]
    assert "".join(alignment["chars"]).startswith("Hello there")
    assert len(alignment["chars"]) == len(alignment["charStartTimesMs"]) == len(alignment["charDurationsMs"])
    assert alignment["charStartTimesMs"] == sorted(alignment["charStartTimesMs"])
    assert messages[-1] == {"isFinal": True}
    assert got.close_code == 1000
    assert not any("type" in m for m in messages)  # nothing of the native protocol leaks


def test_multi_stream_input_closes_contexts_with_isfinal_and_a_barge_in_drops_the_rest(
    tenant: Tenant, voice: str, web: Any
) -> None:
    with eleven_open(web, tenant, eleven_path(voice, multi=True)) as ws:
        send(ws, {"text": " ", "context_id": "a"})
        send(ws, {"text": "One short line. ", "context_id": "a", "flush": True})
        send(ws, {"context_id": "a", "close_context": True})
        got = read_until(
            ws, Got(), lambda g: any(e.get("isFinal") and e.get("contextId") == "a" for _, e in g.events)
        )
        send(ws, {"text": " ", "context_id": "b"})
        send(ws, {"text": LONG, "context_id": "b"})
        read_until(ws, got, lambda g: any(e.get("contextId") == "b" and e.get("audio") for _, e in g.events))
        send(ws, {"context_id": "b", "close_context": True})  # not flushed: a barge-in
        read_until(
            ws, got, lambda g: any(e.get("isFinal") and e.get("contextId") == "b" for _, e in g.events)
        )
        final_b = len(got.events)
        # A flushed turn closed gracefully, then closed again mid-audio: the rest is dropped too.
        send(ws, {"text": " ", "context_id": "c"})
        send(ws, {"text": LONG, "context_id": "c", "flush": True})
        send(ws, {"context_id": "c", "close_context": True})
        read_until(ws, got, lambda g: any(e.get("contextId") == "c" and e.get("audio") for _, e in g.events))
        send(ws, {"context_id": "c", "close_context": True})
        read_until(
            ws, got, lambda g: any(e.get("isFinal") and e.get("contextId") == "c" for _, e in g.events)
        )
        final_c = len(got.events)
        send(ws, {"text": ""})  # a keepalive on multi: nothing is spoken
        send(ws, {"close_socket": True})
        read_until(ws, got, closed)
    messages = [e for _, e in got.events]
    assert (
        sum(
            len(base64.b64decode(m["audio"]))
            for m in messages
            if m.get("contextId") == "a" and m.get("audio")
        )
        > 0
    )
    # Nothing of context b after its isFinal, nor of c after its.
    assert not [m for _, m in got.events[final_b:] if m.get("contextId") == "b"]
    assert not [m for _, m in got.events[final_c:] if m.get("contextId") == "c"]
    heard_c = sum(
        len(base64.b64decode(m["audio"])) for m in messages if m.get("contextId") == "c" and m.get("audio")
    )
    assert 0 < seconds(heard_c) < len(LONG) / 30  # well short of the whole text
    assert got.close_code == 1000
    (row,) = session_rows(tenant)
    assert row.charged_chars < len("One short line. ") + 2 * len(LONG)


def test_an_unknown_output_format_is_refused_in_their_error_shape(
    tenant: Tenant, voice: str, web: Any
) -> None:
    with eleven_open(web, tenant, eleven_path(voice, output_format="pcm_96000")) as ws:
        send(ws, {"text": " "})
        got = read_until(ws, Got(), closed)
    (problem,) = [e for _, e in got.events]
    assert problem["error"] == "invalid_request" and "pcm_96000" in problem["message"]
    assert got.close_code == 4400


def test_an_unknown_voice_is_refused_in_their_error_shape(tenant: Tenant, web: Any) -> None:
    with eleven_open(web, tenant, eleven_path("no-such-voice")) as ws:
        send(ws, {"text": " "})
        got = read_until(ws, Got(), closed)
    (problem,) = [e for _, e in got.events]
    assert "no-such-voice" in problem["message"]
    assert (problem["code"], got.close_code) == (4400, 4400)  # the one mapping: 400 -> 4400


# ----------------------------------------------------------------------------- Deepgram's wire


def test_deepgram_speak_gets_metadata_binary_audio_flushed_and_cleared(
    tenant: Tenant, voice: str, web: Any
) -> None:
    path = f"/v1/speak?model={voice}&encoding=mulaw&sample_rate=8000"
    with open_session(port(web), None, path=path, subprotocols=["token", tenant.raw_key]) as ws:
        send(ws, {"type": "Speak", "text": "Your table is ready."})
        send(ws, {"type": "Flush"})
        got = read_until(ws, Got(), lambda g: g.of("Flushed"))
        heard = len(got.frames)
        send(ws, {"type": "Speak", "text": LONG})  # not flushed: its last sentence waits for more
        read_until(ws, got, lambda g: len(g.frames) > heard)
        send(ws, {"type": "Clear"})
        read_until(ws, got, lambda g: g.of("Cleared"))
        cleared_at = len(got.order)
        send(ws, {"type": "Nonsense"})
        read_until(ws, got, lambda g: g.of("Warning"))
        send(ws, {"type": "Close"})
        read_until(ws, got, closed)
    (metadata,) = got.of("Metadata")
    assert metadata["model_name"] == voice and metadata["request_id"]
    assert [f["sequence_id"] for f in got.of("Flushed")] == [0]
    assert [c["sequence_id"] for c in got.of("Cleared")] == [0]
    (warning,) = got.of("Warning")
    assert warning["code"] == "invalid_request" and "Nonsense" in warning["description"]
    first = got.order[: got.order.index(got.of("Flushed")[0])]
    mulaw = b"".join(m for m in first if isinstance(m, bytes))
    assert len("Your table is ready.") / 30 < len(mulaw) / 8000 < len("Your table is ready.") / 6
    assert not [m for m in got.order[cleared_at:] if isinstance(m, bytes)]  # no audio after Cleared
    assert got.close_code == 1000


def test_deepgram_without_a_key_is_refused_and_with_an_unknown_encoding_too(
    tenant: Tenant, voice: str, web: Any
) -> None:
    with open_session(port(web), None, path=f"/v1/speak?model={voice}", headers={"X-Nothing": "1"}) as ws:
        assert read_until(ws, Got(), closed).close_code == 4401
    path = f"/v1/speak?model={voice}&encoding=opus"
    with open_session(port(web), None, path=path, headers={"Authorization": f"Token {tenant.raw_key}"}) as ws:
        got = read_until(ws, Got(), closed)
    # Theirs is a close frame: the code and our error code as its reason, no message first.
    assert (got.close_code, got.close_reason, got.events) == (4400, "invalid_request", [])


def test_a_full_interactive_lane_refuses_each_dialect_at_once_in_its_own_shape(
    tenant: Tenant, voice: str, web: Any, full_lane: None
) -> None:
    """The one lane and the one error mapping: ElevenLabs' error message then 4429, Deepgram's
    close frame alone."""
    with eleven_open(web, tenant, eleven_path(voice)) as ws:
        sent = time.monotonic()
        send(ws, {"text": " "})
        got = read_until(ws, Got(), closed)
    assert time.monotonic() - sent < 1.0
    (problem,) = [e for _, e in got.events]
    assert (problem["error"], problem["code"], got.close_code) == ("interactive_lane_full", 4429, 4429)
    path = f"/v1/speak?model={voice}"
    with open_session(port(web), None, path=path, headers={"Authorization": f"Token {tenant.raw_key}"}) as ws:
        got = read_until(ws, Got(), closed)
    assert (got.close_code, got.close_reason, got.events) == (4429, "interactive_lane_full", [])


def test_keepalives_and_refused_messages_count_against_the_message_rate(
    tenant: Tenant, voice: str, web: Any
) -> None:
    """A message that means nothing to the session (ElevenLabs' keepalive, a Deepgram message of an
    unknown type) still counts: a flood of them closes the session 4429, as native messages do."""
    from django.conf import settings

    flood = int(settings.TTS_SESSION_MESSAGES_PER_SECOND) + 20
    with eleven_open(web, tenant, eleven_path(voice, multi=True)) as ws:
        send(ws, {"text": " ", "context_id": "a"})
        for _ in range(flood):
            send(ws, {"text": ""})
        got = read_until(ws, Got(), closed)
    assert (got.close_code, got.close_reason) == (4429, "session_limit")
    path = f"/v1/speak?model={voice}"
    with open_session(port(web), None, path=path, headers={"Authorization": f"Token {tenant.raw_key}"}) as ws:
        for _ in range(flood):
            send(ws, {"type": "Nonsense"})
        got = read_until(ws, Got(), closed)
    assert (got.close_code, got.close_reason) == (4429, "session_limit")
