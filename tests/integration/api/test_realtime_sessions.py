"""Realtime sessions (issue 53): ``WS /v1/audio/speech/stream`` through Nginx and TLS, a real worker behind.

Each test opens a socket with the ``websockets`` client, speaks through the tenant's key, and reads
what a voice agent would: events, binary audio, the close code. The rows it reads afterwards are
the ones the server committed (a live tenant).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.api.conftest import Tenant
from tests.integration.api.conftest import https_port as port
from tests.integration.api.session_client import SESSION_PATH, closed, open_session, read_until, send
from tests.integration.api.session_client import Received as Got
from tests.reliability.helpers import PIPER

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tenant(live_tenant: Callable[..., Tenant], web: Any) -> Tenant:
    return live_tenant()


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
    assert (
        kinds[first_audio - 1] in ("audio.start", "bytes", "timestamps")
        and "audio.start" in kinds[:first_audio]
    )
    assert got.close_code == 1000
    (closed_event,) = got.of("session.closed")
    assert closed_event["units"] == 2
    assert closed_event["charged_chars"] == sum(d["charged_chars"] for d in dones) > 0
    # A client waits on every unit: each is interactive work, claimed before batch jobs.
    from webapp.speech.models import SynthesisJob

    lanes = SynthesisJob.objects.filter(organization_id=tenant.org.pk).values_list("lane", flat=True)
    assert list(lanes) == ["interactive", "interactive"]


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
    (entry,) = tenant.client.get("/api/v1/sessions").json()["results"]
    assert entry["id"] == str(session.id) and entry["units"] == 2 and entry["object"] == "speech.session"
    assert entry["charged_characters"] == session.charged_chars > 0
    assert tenant.client.get(f"/api/v1/sessions/{session.id}").json() == entry
    messages = list(WebhookMessage.objects.filter(organization=tenant.org).values_list("event", "payload"))
    assert [event for event, _ in messages] == ["session.completed"]
    payload = messages[0][1]
    assert payload["data"]["id"] == str(session.id) if "data" in payload else payload["id"] == str(session.id)


LONG = " ".join(
    f"This is sentence number {n}, and it is long enough to take a while to say." for n in range(8)
)


def test_input_clear_stops_the_audio_at_once_and_charges_nothing_unsent(
    tenant: Tenant, voice: str, web: Any
) -> None:
    import time as clock

    from webapp.speech.models import SpeechSession, SynthesisJob

    with open_session(port(web), tenant.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": voice})
        send(ws, {"type": "input.text", "text": LONG, "flush": True})
        got = read_until(ws, Got(), lambda g: len(g.frames) >= 3)
        send(ws, {"type": "input.clear"})
        cleared_at = clock.monotonic()
        got = read_until(ws, got, lambda g: g.of("input.cleared"))
        # Still reading: anything sent after the clear would show up now.
        send(ws, {"type": "input.text", "text": "After the clear.", "flush": True})
        got = read_until(
            ws, got, lambda g: any(s["sentence_text"] == "After the clear." for s in g.of("audio.start"))
        )
        late = [t for t, frame in got.frames if t > cleared_at + 0.1]
        after_start = next(t for t, e in got.events if e.get("sentence_text") == "After the clear.")
        assert all(t >= after_start for t in late), (
            "a frame of the cleared context arrived 100 ms after the clear"
        )
        got = read_until(ws, got, lambda g: len(g.of("session.done")) >= 1)
        send(ws, {"type": "session.close"})
        read_until(ws, got, closed)
    (cleared,) = got.of("input.cleared")
    assert cleared["canceled_units"] >= 1 and cleared["dropped_chars"] > 0
    session = SpeechSession.objects.get(organization=tenant.org)
    units = SynthesisJob.objects.filter(session=session)
    canceled = units.filter(status="canceled")
    assert canceled.exists()
    from webapp.speech.services.ledger import reports

    # Units cleared before any of their audio left cost nothing; the whole session costs what left.
    charged = sum(reports.job_charge(j) for j in units.values_list("id", flat=True))
    assert session.charged_chars == charged < len(LONG)
    # (The unit being sent when the clear came pays for the audio of it that left, if any.)
    unsent = canceled.filter(delivered_chars=0, delivered_seconds=0).values_list("id", flat=True)
    assert unsent and all(reports.job_charge(job_id) == 0 for job_id in unsent)


def test_five_contexts_are_independent(tenant: Tenant, voice: str, web: Any) -> None:
    with open_session(port(web), tenant.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": voice})
        for n in range(5):
            send(ws, {"type": "input.text", "text": f"Context {n} says its line.", "context_id": f"c{n}"})
        send(ws, {"type": "input.clear", "context_id": "c2"})
        for n in range(5):
            if n != 2:
                send(ws, {"type": "input.done", "context_id": f"c{n}"})
        got = read_until(ws, Got(), lambda g: len(g.of("session.done")) >= 4)
        send(ws, {"type": "session.close"})
        read_until(ws, got, closed)
    spoken = {s["context_id"]: s["sentence_text"] for s in got.of("audio.start")}
    assert spoken == {f"c{n}": f"Context {n} says its line." for n in (0, 1, 3, 4)}
    assert {d["context_id"] for d in got.of("session.done")} == {"c0", "c1", "c3", "c4"}
    assert got.of("input.cleared")[0]["context_id"] == "c2"


def test_timestamps_place_words_in_everything_the_client_sent(tenant: Tenant, voice: str, web: Any) -> None:
    pieces = [
        ("a", "Good morning "),
        ("b", "Second context here. "),
        ("a", "to you all. "),
        ("b", "More words."),
    ]
    sent = "".join(text for _, text in pieces)
    with open_session(port(web), tenant.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": voice})
        for context, text in pieces:
            send(ws, {"type": "input.text", "text": text, "context_id": context})
        send(ws, {"type": "input.done", "context_id": "a"})
        send(ws, {"type": "input.done", "context_id": "b"})
        got = read_until(ws, Got(), lambda g: len(g.of("session.done")) >= 2)
    events = got.of("timestamps")
    assert events, "no timestamps event"
    words = [w for e in events for w in e["words"]]
    assert words and all(sent[w["char_start"] : w["char_end"]] == w["text"] for w in words)
    assert {w["text"] for w in words} >= {"morning", "all", "words"}
    starts = got.of("audio.start")
    assert all(
        sent[s["text_start"] : s["text_end"]].startswith(s["sentence_text"].split()[0]) for s in starts
    )


def test_a_worker_killed_mid_unit_requeues_it_and_the_session_goes_on(
    live_tenant: Callable[..., Tenant],
    web: Any,
    stack: Any,
    builtin_voices: list[str],
    no_session_worker: None,
) -> None:
    from tests.reliability.helpers import flush_queues, start_worker, usage_events
    from webapp.speech.models import SynthesisJob

    flush_queues(stack, "synth.piper")
    worker = start_worker(
        stack,
        "w-session-kill",
        engines="piper",
        TTS_WORKER_HOOKS="tests.faults",
        TTS_FAULT_CRASH_ONCE_MARKER="Zebra",
    )
    try:
        tenant = live_tenant()
        voice = PIPER
        with open_session(port(web), tenant.raw_key) as ws:
            send(ws, {"type": "session.config", "voice": voice})
            send(
                ws, {"type": "input.text", "text": "Zebra crossings ask drivers to slow down.", "flush": True}
            )
            send(ws, {"type": "input.text", "text": "The next unit follows.", "flush": True})
            got = read_until(ws, Got(), lambda g: len(g.of("session.done")) >= 2, timeout=90)
        dones = got.of("audio.done")
        assert [d["error"] for d in dones] == [False, False]
        assert [s["sentence_text"] for s in got.of("audio.start")] == [
            "Zebra crossings ask drivers to slow down.",
            "The next unit follows.",
        ]
        killed = SynthesisJob.objects.get(organization=tenant.org, text__startswith="Zebra")
        assert killed.status == "succeeded" and killed.attempts == 2  # the fault overlapped the unit
        assert usage_events(killed.id) == ["charge", "reserve"]  # charged once
        assert dones[0]["charged_chars"] == killed.text_chars
        # Heard once: the unit's bytes are about one rendering of it (24 kHz, 16-bit), not two spliced.
        one = (killed.duration_seconds or 0) * 24000 * 2
        assert 0.7 * one < dones[0]["total_bytes"] < 1.3 * one
    finally:
        stack.stop_service(worker)


def test_a_client_that_leaves_pays_for_the_units_whose_audio_left(
    tenant: Tenant, voice: str, web: Any
) -> None:
    from webapp.speech.models import SpeechSession, SynthesisJob

    ws = open_session(port(web), tenant.raw_key)
    send(ws, {"type": "session.config", "voice": voice})
    send(ws, {"type": "input.text", "text": LONG, "flush": True})
    got = read_until(ws, Got(), lambda g: g.of("audio.done"))
    ws.close()  # gone mid-way: units after the first may be rendered, queued or partly sent
    first = got.of("audio.done")[0]
    deadline = time.monotonic() + 30
    while SpeechSession.objects.filter(organization=tenant.org, status="open").exists():
        assert time.monotonic() < deadline, "the session was not closed"
        time.sleep(0.1)
    session = SpeechSession.objects.get(organization=tenant.org)
    assert (session.close_code, session.close_reason) == (1000, "client_closed")  # its close frame's code
    whole = [d for d in got.of("audio.done") if not d.get("cleared")]
    assert session.charged_chars >= first["charged_chars"] > 0
    assert session.charged_chars <= sum(d["charged_chars"] for d in whole) + len(LONG) // 8 + 1
    # Nothing left queued; a unit a worker was rendering ends at its sentence's end (canceled).
    while SynthesisJob.objects.filter(session=session, status__in=["queued", "running"]).exists():
        assert time.monotonic() < deadline, "units of the closed session are still queued or running"
        time.sleep(0.1)


def test_stream_audio_false_sends_each_unit_in_one_frame_and_mp3_is_mp3(
    tenant: Tenant, voice: str, web: Any
) -> None:
    with open_session(port(web), tenant.raw_key) as ws:
        send(ws, {"type": "session.config", "voice": voice, "stream_audio": False, "response_format": "mp3"})
        send(ws, {"type": "input.text", "text": "First unit here. Second unit there.", "flush": True})
        got = read_until(ws, Got(), lambda g: g.of("session.done"))
    assert len(got.frames) == 2
    for _, frame in got.frames:
        assert frame[:3] == b"ID3" or (frame[0] == 0xFF and frame[1] & 0xE0 == 0xE0)
    assert [d["total_bytes"] for d in got.of("audio.done")] == [len(f) for _, f in got.frames]


def test_every_key_form_agents_send_opens_a_session_through_nginx_and_no_log_keeps_a_query_key(
    tenant: Tenant, voice: str, web: Any
) -> None:
    """Token, xi-api-key (header, query), Deepgram's and OpenAI's subprotocol forms, through Nginx;
    a key in the query is REDACTED in Nginx's access log and in gunicorn's log lines alike."""
    from tests.stack import CFG

    key = tenant.raw_key
    agent = {"User-Agent": "agent-sdk"}  # a header, so open_session adds no Authorization of its own
    forms: list[tuple[str, dict[str, Any], str | None]] = [
        ("Token", {"headers": {"Authorization": f"Token {key}"}}, None),
        ("xi-api-key header", {"headers": {"xi-api-key": key}}, None),
        ("query", {"headers": agent, "path": f"{SESSION_PATH}?xi-api-key={key}&model=tts-1"}, None),
        ("Deepgram", {"subprotocols": ["token", key]}, "token"),
        ("OpenAI", {"subprotocols": ["realtime", f"openai-insecure-api-key.{key}"]}, "realtime"),
    ]
    for name, how, echoed in forms:
        with open_session(port(web), None, **how) as ws:
            assert ws.subprotocol == echoed, name
            send(ws, {"type": "session.config", "voice": voice})
            got = read_until(ws, Got(), lambda g: g.of("session.ready") or closed(g), timeout=20)
            assert got.of("session.ready"), (name, got.close_code, got.close_reason)
    forged = key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")
    with open_session(port(web), None, headers=agent, path=f"{SESSION_PATH}?xi_api_key={forged}") as ws:
        got = read_until(ws, Got(), closed, timeout=10)
    assert (got.close_code, got.close_reason) == (4401, "unauthenticated")

    secret, forged_secret = key.split("_", 2)[2], forged.split("_", 2)[2]  # tts_<prefix>_<secret>
    deadline = time.monotonic() + 10
    while True:
        logs = {n: (CFG.log_dir / f"{n}.log").read_text(errors="replace") for n in ("nginx", "gunicorn")}
        if all("xi_api_key=REDACTED" in text for text in logs.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for name, text in logs.items():
        assert "xi-api-key=REDACTED" in text and "xi_api_key=REDACTED" in text, name
        assert secret not in text and forged_secret not in text, name
