"""Cloned voices on a remote model (issue 57, item 1): a consented voice is cloned upstream through
``ref_audio`` + ``ref_text`` (stateless, the default); with ``register_voices`` it is registered on
each replica that speaks it and named there after, each registration a row; a deleted voice is
deleted on every replica, retried until each confirms; a replica that lost a voice gets the
chunk with ``ref_audio`` again. Two replicas of the fake vLLM-Omni server behind a real worker."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import prompt_files as pf
from tests.reliability.helpers import make_org, media_root, start_worker, wait_status, wait_until
from tests.stack import TestStack
from tests.upstream.harness import Upstream

pytestmark = pytest.mark.django_db(transaction=True)

STATELESS, KEEPING = "cosyvoice3", "cosyvoice3kept"  # one upstream model, served two ways here
CLONE_ONLY = "cosyvoice3clone"  # the same again, declared with no preset voice
TEXT = "The first sentence is here. Then a second one follows. And this is the third."


@pytest.fixture(scope="module")
def worker(
    stack: TestStack, upstreams: list[Upstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    path = tmp_path_factory.mktemp("voice-remote") / "remote-models.json"
    base = {
        "upstreams": [u.url for u in upstreams],
        "upstream_model": STATELESS,
        "voices": [{"id": "alloy"}],
        "cloning": True,
        "read_timeout_seconds": 5,
    }
    models = {
        STATELESS: base,
        KEEPING: {**base, "register_voices": True},
        CLONE_ONLY: {**base, "voices": []},
    }
    path.write_text(json.dumps({"models": models}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TTS_REMOTE_MODELS_FILE", str(path))
        service = start_worker(
            stack,
            "remote-voices",
            engines=f"{STATELESS},{KEEPING},{CLONE_ONLY}",
            TTS_REMOTE_MODELS_FILE=str(path),
            TTS_REMOTE_VOICE_DELETE_SECONDS="0.5",
        )
        try:
            yield service
        finally:
            stack.stop_service(service)


@pytest.fixture
def voices(db: None, worker: Any, upstreams: list[Upstream]) -> None:
    from synth.registry import list_voices
    from webapp.speech.voices import sync_builtin_voices

    sync_builtin_voices(list_voices(engines=[STATELESS, KEEPING, CLONE_ONLY]))
    for upstream in upstreams:
        if upstream.process.poll() is None:
            upstream.control(fail_voice_deletes=False, chunk_delay_ms=0)


def cloned_voice(org: Any, tmp: Path) -> Any:
    """A ready zero_shot voice under an active consent, its prompt slt's voice (as an upload leaves it)."""
    from webapp.speech.models import Voice, VoiceConsent

    consent = VoiceConsent.objects.create(
        organization=org,
        name="slt",
        language="en",
        phrase_text="I consent. My code is 1 2 3 4 5 6.",
        code="123456",
        checked_by=VoiceConsent.Check.RECOGNISED,
        heard_code="123456",
        recording_sha256="0" * 64,
        created_by_label="test",
    )
    pk = uuid.uuid4()
    relative = f"voices/{org.pk}/{pk.hex}.wav"
    target = Path(media_root()) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(pf.flite("slt", tmp / "slt.wav"), target)
    return Voice.objects.create(
        id=pk,
        voice_id=f"voice-{pk.hex}",
        organization=org,
        name="Cloned",
        language="en",
        sample_rate=16000,
        status=Voice.Status.READY,
        prompt_path=relative,
        transcript=pf.PROMPT_SENTENCE,
        cloning_mode="zero_shot",
        consent=consent,
        embedding=[0.1] * 256,
    )


def speak(org: Any, voice: Any, model: str, jobs: int = 1, speaker: str = "alloy") -> None:
    """``jobs`` jobs at once of ``voice`` cloned by remote model ``model`` (its cloning voice speaks,
    given the prompt); one job's chunks go to one replica, the least loaded, so two at once reach
    both when the replicas are slow enough to overlap them."""
    from webapp.speech import lifecycle
    from webapp.speech.models import Voice

    request = lifecycle.JobRequest(
        text=TEXT,
        voice=voice,
        format="wav",
        sample_rate=None,
        params={},
        billable_chars=len(TEXT),
        use_cache=False,
        speaker=Voice.objects.get(voice_id=f"{model}:{speaker}"),
    )
    ids = [lifecycle.submit_job(org, request)[0].id for _ in range(jobs)]
    for row in wait_status(ids, timeout=60):
        assert (row.status, row.engine) == ("succeeded", model), (row.error_code, row.error_message)


def bodies(upstreams: list[Upstream], since: dict[str, int]) -> list[dict[str, Any]]:
    """The speech requests the replicas got after ``since`` (their totals then), their bodies."""
    out = []
    for u in upstreams:
        stats = u.stats()
        fresh = stats["requests_total"] - since[u.url]
        speech = [r for r in stats["requests"] if r.get("path") == "/v1/audio/speech"]
        out += [r["body"] for r in speech[len(speech) - fresh :]] if fresh else []
    return out


def totals(upstreams: list[Upstream]) -> dict[str, int]:
    return {u.url: int(u.stats()["requests_total"]) for u in upstreams}


def uploaded(upstream: Upstream) -> set[str]:
    import requests

    listed = requests.get(f"{upstream.url}/v1/audio/voices", timeout=5).json()["uploaded_voices"]
    return {v["name"] for v in listed}


def test_a_consented_voice_is_cloned_upstream_with_ref_audio_and_nothing_is_kept_there(
    voices: None, upstreams: list[Upstream], tmp_path: Path
) -> None:
    from webapp.speech.models import UpstreamVoice

    voice = cloned_voice(make_org("remote-clone"), tmp_path)
    since = totals(upstreams)
    speak(voice.organization, voice, STATELESS)
    sent = bodies(upstreams, since)
    assert len(sent) == 3  # a request per sentence, each carrying the prompt
    for body in sent:
        # (/_stats shows a reference audio as its length: a 16 kHz prompt of seconds, base64.)
        assert body["ref_audio"]["length"] > 50_000 and body["ref_text"] == pf.PROMPT_SENTENCE
        assert body["task_type"] == "Base" and "voice" not in body
    assert not UpstreamVoice.objects.exists() and not any(uploaded(u) for u in upstreams)


def test_a_kept_voice_is_registered_on_each_replica_then_named_and_deleted_everywhere_with_it(
    voices: None, upstreams: list[Upstream], tmp_path: Path, admin_client: Any
) -> None:
    from webapp.speech.models import UpstreamVoice
    from webapp.speech.voices import delete_voice

    voice = cloned_voice(make_org("remote-keep"), tmp_path)
    name = f"tts-{voice.pk}"
    for upstream in upstreams:
        upstream.control(chunk_delay_ms=300)
    speak(voice.organization, voice, KEEPING, jobs=2)  # a replica's first use uploads, in the background
    for upstream in upstreams:
        upstream.control(chunk_delay_ms=0)
    wait_until(
        lambda: UpstreamVoice.objects.filter(voice=voice, registered_at__isnull=False).count() == 2,
        20,
        "the voice registered on both replicas",
    )
    assert all(uploaded(u) == {name} for u in upstreams)
    since = totals(upstreams)
    speak(voice.organization, voice, KEEPING)
    sent = bodies(upstreams, since)
    assert len(sent) == 3 and all(b["voice"] == name and "ref_audio" not in b for b in sent)

    # One replica refuses deletions for a while: the other confirms, it is retried until it does.
    upstreams[1].control(fail_voice_deletes=True)
    delete_voice(voice.organization, voice)
    rows = UpstreamVoice.objects.filter(name=name)
    assert rows.count() == 2 and not rows.filter(voice__isnull=False).exists()  # both owed
    wait_until(lambda: not uploaded(upstreams[0]), 10, "the first replica's deletion")
    wait_until(
        lambda: UpstreamVoice.objects.filter(name=name, delete_attempts__gte=1).exists(),
        10,
        "a refused deletion recorded",
    )
    refused = UpstreamVoice.objects.get(name=name)
    assert refused.upstream == upstreams[1].url and refused.last_error.startswith("500")
    assert uploaded(upstreams[1]) == {name}  # still there: nothing lets it go unconfirmed
    shown = admin_client.get("/admin/speech/operations/data.json").json()["upstreams"]
    (owed,) = [r for r in shown if (r["model"], r["url"]) == (KEEPING, upstreams[1].url)]
    assert (owed["owed"], owed["kept"]) == (1, 0)  # the operator sees the deletion still owed
    upstreams[1].control(fail_voice_deletes=False)
    wait_until(lambda: not UpstreamVoice.objects.filter(name=name).exists(), 20, "the retried deletion")
    assert not uploaded(upstreams[1])


def test_a_replica_that_lost_a_kept_voice_gets_ref_audio_and_the_voice_again(
    voices: None, upstreams: list[Upstream], tmp_path: Path
) -> None:
    import requests

    from webapp.speech.models import UpstreamVoice

    voice = cloned_voice(make_org("remote-lost"), tmp_path)
    name = f"tts-{voice.pk}"
    speak(voice.organization, voice, KEEPING)  # one job: its chunks all go to the first replica
    wait_until(
        lambda: UpstreamVoice.objects.filter(voice=voice, registered_at__isnull=False).exists(),
        20,
        "the voice registered",
    )
    (kept,) = UpstreamVoice.objects.filter(voice=voice)
    (replica,) = [u for u in upstreams if u.url == kept.upstream]
    first_registered = kept.registered_at
    # As a restart would: the replica forgets it, and refuses the name with a 400.
    assert requests.delete(f"{replica.url}/v1/audio/voices/{name}", timeout=5).ok
    since = totals(upstreams)
    speak(voice.organization, voice, KEEPING)  # succeeds: the refused chunk is sent again with the prompt
    sent = bodies([replica], {replica.url: since[replica.url]})
    assert sent[0]["voice"] == name and "ref_audio" not in sent[0]  # refused
    assert "ref_audio" in sent[1]  # the same chunk again, with the prompt
    wait_until(lambda: uploaded(replica) == {name}, 20, "the voice registered there again")
    kept.refresh_from_db()
    assert first_registered is not None and kept.registered_at is not None
    assert kept.registered_at > first_registered


def test_a_model_with_no_preset_voice_speaks_only_uploaded_voices(
    voices: None, upstreams: list[Upstream], tmp_path: Path
) -> None:
    from tests.plugin_builds import make_client

    org, _, client = make_client()
    r = client.post("/v1/audio/speech", {"model": CLONE_ONLY, "voice": "cloned", "input": "Hello there."})
    error = r.json()["error"]  # the OpenAI endpoint's own error shape
    assert r.status_code == 400 and error["code"] == "unknown_voice", r.content
    assert "uploaded zero_shot voice" in error["message"]
    since = totals(upstreams)
    voice = cloned_voice(org, tmp_path)
    speak(org, voice, CLONE_ONLY, speaker="cloned")  # the placeholder is the cloning voice of a clone
    assert all("ref_audio" in body for body in bodies(upstreams, since))
