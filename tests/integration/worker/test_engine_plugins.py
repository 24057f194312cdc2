"""Engines as plugins (issue 50): a package installed beside the service adds an engine.

A real distribution is built from tests/engine_plugins/tiny (pip, setuptools: a dist-info
with entry_points.txt) into a folder put on the worker's PYTHONPATH; importlib.metadata is
not patched. The web tier (Django in this process, and gunicorn + Nginx for the OpenAI
client) and a real Celery worker on the test stack's PostgreSQL and Redis do the rest.
"""

from __future__ import annotations

import io
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import openai
import pytest
import soundfile

from tests.integration.api.conftest import base_url, problem, wait_finished
from tests.plugin_builds import build_plugin, make_client, python_path
from tests.reliability.helpers import flush_queues, start_worker
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ("synth.tiny", "synth.tinyclone", "synth.tinyclone2", "synth.espeak")


def wait_no_beat_with(stack: TestStack, engine: str, timeout: float = 15) -> None:
    """Until no live heartbeat says its host has ``engine`` (a stopped worker's lapse after their TTL)."""
    deadline = time.monotonic() + timeout
    while any(engine in (b.get("installed") or []) for b in stack.heartbeats()):
        assert time.monotonic() < deadline, "a stopped worker's heartbeat outlived its TTL"
        time.sleep(0.2)


@pytest.fixture
def plugin_site(stack: TestStack, tmp_path: Path) -> Iterator[Path]:
    flush_queues(stack, *QUEUES)
    yield build_plugin(tmp_path)
    flush_queues(stack, *QUEUES)


def test_an_installed_engine_package_serves_its_voices_and_models_and_goes_when_removed(
    stack: TestStack, plugin_site: Path, web: Any
) -> None:
    _, raw_key, client = make_client()
    worker = start_worker(stack, "plugin-w1", engines="tiny", PYTHONPATH=python_path(plugin_site))
    try:
        voices = {v["id"]: v for v in client.get("/api/v1/voices").json()["results"]}
        assert {"tiny:beep", "tiny:boop"} <= set(voices), sorted(voices)
        assert voices["tiny:beep"]["engine"] == "tiny"
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "tiny"} <= set(models)
        caps = models["tiny"]["capabilities"]
        assert models["tiny"]["served"] is True and models["tiny"]["voices"] == 2
        assert caps["cloning"] is False and caps["devices"] == ["cpu"] and caps["concurrent_jobs"] == 1
        assert caps["languages"] == ["en", "en-us"] and caps["instructions"] is False

        # A job on it, through the native API: by the namespaced id, and by model + bare name.
        r = client.post(
            "/api/v1/speech", {"text": "Hello there. Bye.", "voice": "tiny:beep", "format": "wav"}
        )
        assert r.status_code == 202, r.content
        done = wait_finished(client, r.json()["id"], timeout=60)
        assert done["status"] == "succeeded", done
        assert done["metrics"]["engine"] == "tiny"
        r = client.post("/api/v1/speech", {"text": "Hi.", "voice": "boop", "engine": "tiny"})
        assert r.status_code == 202 and r.json()["voice"] == "tiny:boop", r.content
        assert wait_finished(client, r.json()["id"], timeout=60)["status"] == "succeeded"

        # Its capabilities are read: it takes no instructions, and an unknown model is a 400.
        r = client.post("/api/v1/speech", {"text": "Hi.", "voice": "tiny:beep", "instructions": "whisper"})
        assert r.status_code == 400 and problem(r)["field"] == "instructions", r.content
        r = client.post("/api/v1/speech", {"text": "Hi.", "voice": "beep", "engine": "nosuch"})
        assert r.status_code == 400 and problem(r)["code"] == "unknown_model"
        sse = {"model": "tiny", "voice": "beep", "input": "Hi.", "stream_format": "sse", "timestamps": True}
        r = client.post("/v1/audio/speech", sse)  # it declares no word timestamps
        assert r.status_code == 400 and r.json()["error"]["param"] == "timestamps", r.content

        # The OpenAI client names the model, and the voice as that model calls it.
        oai = openai.OpenAI(
            base_url=f"{base_url(web)}/v1",
            api_key=raw_key,
            http_client=httpx2.Client(verify=False, trust_env=False),
            max_retries=0,
            timeout=60,
        )
        wav = oai.audio.speech.create(model="tiny", voice="boop", input="One two.", response_format="wav")
        audio, rate = soundfile.read(io.BytesIO(wav.content))
        assert rate == 16000 and len(audio) > 0.1 * rate
        spectrum = np.abs(np.fft.rfft(audio[:4000]))
        assert abs(np.argmax(spectrum) * rate / 4000 - 220) < 10  # boop's tone: the tiny engine spoke
        with pytest.raises(openai.BadRequestError) as refused:
            oai.audio.speech.create(model="nosuch", voice="boop", input="One.")
        assert refused.value.code == "unknown_model" and refused.value.param == "model"
    finally:
        stack.stop_service(worker)

    # Installed but broken (its weights missing): the worker lives, and says so.
    wait_no_beat_with(stack, "tiny")
    worker = start_worker(
        stack, "plugin-w2", engines="espeak,tiny", PYTHONPATH=python_path(plugin_site), TINY_TTS_FAIL_LOAD="1"
    )
    try:
        r = client.post("/api/v1/speech", {"text": "Hi.", "voice": "tiny:beep"})
        assert r.status_code == 503 and problem(r)["code"] == "engine_unavailable", r.content
        assert int(r["Retry-After"]) > 0
        beats = [b for b in stack.heartbeats() if "tiny" in (b.get("unavailable") or {})]
        assert beats and all(b["state"] == "ready" and b["engines"] == ["espeak"] for b in beats), beats
    finally:
        stack.stop_service(worker)

    # Removed: its voices and its model are gone.
    shutil.rmtree(plugin_site)
    wait_no_beat_with(stack, "tiny")
    worker = start_worker(stack, "plugin-w3", engines="espeak", PYTHONPATH=python_path(plugin_site))
    try:
        left = {v["id"] for v in client.get("/api/v1/voices").json()["results"]}
        assert "espeak-en-us" in left and not any(v.startswith("tiny:") for v in left), sorted(left)
        model_ids = {m["id"] for m in client.get("/v1/models").json()["data"]}
        assert "tiny" not in model_ids and "espeak" in model_ids
    finally:
        stack.stop_service(worker)


@pytest.mark.usefixtures("recognised_consent_codes")
def test_a_zero_shot_voice_speaks_through_any_model_that_clones(
    stack: TestStack, plugin_site: Path, tmp_path: Path, web: Any
) -> None:
    from django.conf import settings

    from tests import prompt_files as pf
    from webapp.speech.models import SynthesisJob

    _, raw_key, client = make_client()
    worker = start_worker(
        stack, "plugin-clone", engines="tiny,tinyclone,tinyclone2", PYTHONPATH=python_path(plugin_site)
    )
    analysis = stack.start_worker(
        "plugin-analysis", queues="analysis", env={"TTS_WORKER_ROLE": "analysis"}, wait_ready=False
    )
    try:
        # Cloning needs a recorded consent of the speaker (issue 52): slt reads the phrase.
        phrase = client.get("/v1/audio/voice_consents/phrase").json()
        with open(pf.read_aloud("slt", tmp_path / "consent.wav", phrase["text"]), "rb") as fh:
            form = {"name": "slt", "language": "en", "recording": fh}
            r = client.client.post("/api/v1/voice_consents", form, HTTP_AUTHORIZATION=f"Bearer {raw_key}")
        assert r.status_code == 201, r.content
        with open(pf.flite("slt", tmp_path / "slt.wav"), "rb") as fh:
            form = {"name": "Zero", "consent": r.json()["id"], "cloning_mode": "zero_shot", "audio": fh}
            r = client.client.post("/api/v1/voices", form, HTTP_AUTHORIZATION=f"Bearer {raw_key}")
        assert r.status_code == 202, r.content
        voice_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while (voice := client.get(f"/api/v1/voices/{voice_id}").json())["status"] == "processing":
            assert time.monotonic() < deadline, "the analysis did not finish"
            time.sleep(0.5)
        assert voice["status"] == "ready", voice
        assert voice["engine"] == ""  # the analysis bound it to no model
        from webapp.speech.models import Voice

        canonical, _ = soundfile.read(
            Path(settings.MEDIA_ROOT) / Voice.objects.get(voice_id=voice_id).prompt_path, dtype="float32"
        )

        for model in ("tinyclone", "tinyclone2"):
            r = client.post("/api/v1/speech", {"text": "Hello.", "voice": voice_id, "engine": model})
            assert r.status_code == 202, r.content
            done = wait_finished(client, r.json()["id"], timeout=60)
            assert done["status"] == "succeeded", done
            row = SynthesisJob.objects.get(pk=done["id"])
            assert row.engine == model and row.cloning_mode == "zero_shot"
            audio, _ = soundfile.read(Path(settings.MEDIA_ROOT) / row.audio_path, dtype="float32")
            # The clone engine speaks the prompt's first half second: it was given the prompt.
            assert np.corrcoef(audio[:8000], canonical[:8000])[0, 1] > 0.99
        # Asked to stream, a model that streams answers chunked; one that does not, the whole file.
        for model, chunked in (("tinyclone", True), ("tinyclone2", False)):
            body = {"model": model, "voice": voice_id, "input": "One. Two.", "response_format": "wav"}
            answer = httpx2.post(
                f"{base_url(web)}/v1/audio/speech",
                json={**body, "stream_format": "audio"},
                headers={"Authorization": f"Bearer {raw_key}"},
                verify=False,
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            assert ("content-length" not in answer.headers) is chunked, (model, answer.headers)
            assert len(soundfile.read(io.BytesIO(answer.content))[0]) >= 16000  # two half-second sentences
        r = client.post("/api/v1/speech", {"text": "Hello.", "voice": voice_id, "engine": "tiny"})
        assert r.status_code == 422 and problem(r)["code"] == "cloning_unavailable", r.content
        r = client.post("/api/v1/speech", {"text": "Hello.", "voice": voice_id})
        assert r.status_code == 202, r.content  # no model named: one that clones
        assert SynthesisJob.objects.get(pk=r.json()["id"]).engine in ("tinyclone", "tinyclone2")
        wait_finished(client, r.json()["id"], timeout=60)
    finally:
        stack.stop_service(analysis)
        stack.stop_service(worker)
