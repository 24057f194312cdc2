"""Cloning under a checked consent, end to end on the tiny VoxCPM (issue 52).

phrase -> flite reads it -> consent recorded -> a voice uploaded naming it (the analysis worker
checks it is the same speaker) -> a zero_shot job on the VoxCPM model -> revoke -> the running
job ends ``consent_revoked`` at its next sentence and the next submit is refused. Real web tier,
real analysis and VoxCPM workers, on the test stack's PostgreSQL and Redis.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import prompt_files as pf
from tests.integration.api.conftest import ApiClient, problem, wait_finished
from tests.integration.voxcpm.conftest import worker_path
from tests.plugin_builds import make_client
from tests.reliability.helpers import flush_queues, start_worker, wait_until
from tests.stack import TestStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("recognised_consent_codes")]


def consent(client: ApiClient, tmp: Path, reader: str) -> str:
    """A consent recorded with ``reader`` (a flite voice) reading a fresh phrase: its id."""
    phrase = client.get("/v1/audio/voice_consents/phrase").json()
    wav = pf.read_aloud(reader, tmp / f"consent-{reader}.wav", phrase["text"])
    with open(wav, "rb") as fh:
        form = {"name": reader, "language": "en", "recording": fh}
        r = client.client.post("/api/v1/voice_consents", form, **client._headers(None))
    assert r.status_code == 201, r.content
    return str(r.json()["id"])


def voice(client: ApiClient, tmp: Path, speaker: str, consent_id: str) -> dict[str, Any]:
    """A zero_shot voice of ``speaker`` naming the consent, once its analysis decided it."""
    with open(pf.flite(speaker, tmp / f"prompt-{speaker}.wav"), "rb") as fh:
        form = {"name": speaker, "consent": consent_id, "cloning_mode": "zero_shot", "audio": fh}
        r = client.client.post("/api/v1/voices", form, **client._headers(None))
    assert r.status_code == 202, r.content
    url = f"/api/v1/voices/{r.json()['id']}"
    decided: dict[str, Any] = wait_until(
        lambda: (v := client.get(url).json())["status"] != "processing" and v, 120, "the analysis"
    )
    return decided


@pytest.fixture(scope="module")
def workers(stack: TestStack, voxcpm_models: Path, voxcpm_site: Path) -> Iterator[None]:
    """One VoxCPM worker and one analysis worker for the module's tests (each start costs seconds)."""
    stack.stop_session_worker()
    flush_queues(stack, "synth.voxcpm", "analysis")
    synth = start_worker(
        stack,
        "voxcpm-clone",
        engines="voxcpm",
        PYTHONPATH=worker_path(voxcpm_site),
        TTS_MODELS_DIR=str(voxcpm_models),
    )
    analysis = stack.start_worker(
        "consent-analysis", queues="analysis", env={"TTS_WORKER_ROLE": "analysis"}, wait_ready=False
    )
    try:
        yield
    finally:
        stack.stop_service(analysis)
        stack.stop_service(synth)


@pytest.fixture
def voxcpm_voices(db: None) -> None:
    """The VoxCPM model's voices as Voice rows, as its worker wrote them (a flush between transactional
    tests removes them; the module's worker announced them once)."""
    from synth.registry import list_voices
    from webapp.speech.voices import sync_builtin_voices

    sync_builtin_voices(list_voices(engines=["voxcpm"]))


def test_a_consented_voice_is_cloned_until_its_consent_is_revoked(
    stack: TestStack, workers: None, voxcpm_voices: None, tmp_path: Path
) -> None:
    from webapp.speech.models import SynthesisJob

    _, _raw, client = make_client()
    cons = consent(client, tmp_path, "slt")
    ready = voice(client, tmp_path, "slt", cons)
    assert ready["status"] == "ready" and ready["cloning_mode"] == "zero_shot", ready
    assert ready["consent"]["id"] == cons

    r = client.post("/api/v1/speech", {"text": "Hello there.", "voice": ready["id"], "engine": "voxcpm"})
    assert r.status_code == 202, r.content
    done = wait_finished(client, r.json()["id"], timeout=90)
    assert done["status"] == "succeeded", done
    assert SynthesisJob.objects.get(pk=done["id"]).cloning_mode == "zero_shot"

    long_text = " ".join(f"Sentence number {n} is here." for n in range(40))
    r = client.post("/api/v1/speech", {"text": long_text, "voice": ready["id"], "engine": "voxcpm"})
    running = r.json()["id"]
    wait_until(
        lambda: (j := client.get(f"/api/v1/speech/{running}").json())["progress"] > 0 and j, 90, "progress"
    )
    revoked = client.delete(f"/v1/audio/voice_consents/{cons}")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    ended = client.get(f"/api/v1/speech/{running}").json()
    assert ended["status"] == "failed" and ended["error"]["code"] == "consent_revoked", ended
    # Its attempt stopped at the next sentence: the worker's one child takes the next job at once.
    started = time.monotonic()
    r = client.post("/api/v1/speech", {"text": "Plain.", "voice": "voxcpm:default"})
    assert wait_finished(client, r.json()["id"], timeout=60)["status"] == "succeeded"
    assert time.monotonic() - started < 20

    refused = client.post("/api/v1/speech", {"text": "Again.", "voice": ready["id"], "engine": "voxcpm"})
    body = problem(refused)
    assert refused.status_code == 422 and body["code"] == "cloning_unavailable", body
    assert body["reason"] == "consent_revoked"


def test_a_consent_read_by_another_speaker_does_not_clone_the_prompt(
    stack: TestStack, workers: None, voxcpm_voices: None, tmp_path: Path
) -> None:
    _, _raw, client = make_client()
    cons = consent(client, tmp_path, "awb")
    rejected = voice(client, tmp_path, "slt", cons)
    assert rejected["status"] == "rejected" and rejected["rejected_code"] == "consent_mismatch", rejected
    assert "not the prompt's speaker" in rejected["status_reason"]


def test_a_voice_uploaded_before_becomes_cloneable_by_naming_a_consent_of_its_speaker(
    stack: TestStack, workers: None, voxcpm_voices: None, tmp_path: Path
) -> None:
    from webapp.speech.models import Voice

    _, _raw, client = make_client()
    # A voice from before consents: uploaded and analysed as now, then left as such voices are (no
    # consent, approximate). Its approximate analysis itself would take minutes on a cold profile cache.
    first = voice(client, tmp_path, "slt", consent(client, tmp_path, "slt"))
    Voice.objects.filter(voice_id=first["id"]).update(consent=None, cloning_mode="approximate")
    url = f"/api/v1/voices/{first['id']}"
    before = client.get(url).json()
    assert before["cloning_mode"] == "approximate" and before["consent"]["id"] is None

    other = consent(client, tmp_path, "awb")
    wait_until(lambda: _embedded(other), 60, "the consent's embedding")
    refused = client.post(f"{url}/consent", {"consent": other})
    assert refused.status_code == 422 and problem(refused)["check"] == "speaker", refused.content

    own = consent(client, tmp_path, "slt")
    wait_until(lambda: _embedded(own), 60, "the consent's embedding")
    added = client.post(f"{url}/consent", {"consent": own})
    assert added.status_code == 200, added.content
    assert added.json()["cloning_mode"] == "zero_shot" and added.json()["consent"]["id"] == own
    r = client.post("/api/v1/speech", {"text": "Hello there.", "voice": before["id"], "engine": "voxcpm"})
    assert r.status_code == 202, r.content
    assert wait_finished(client, r.json()["id"], timeout=90)["status"] == "succeeded"


def _embedded(consent_id: str) -> bool:
    from webapp.speech.models import VoiceConsent

    return VoiceConsent.objects.filter(pk=consent_id.removeprefix("cons_"), embedding__isnull=False).exists()


def data_url(path: Path) -> str:
    return "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode()


def test_ref_audio_clones_for_one_request_under_its_consent_and_is_gone_when_the_job_ends(
    stack: TestStack, workers: None, voxcpm_voices: None, tmp_path: Path, settings: Any
) -> None:
    """vLLM-Omni's ref_audio + ref_text on /v1/audio/speech (issue 56, item 2): a one-off prompt, on
    the upload's path (decode sandbox, limits, the analysis's speaker check against the consent)."""
    from webapp.speech.models import SynthesisJob, Voice, VoiceConsent

    settings.TTS_OPENAI_VOICE_READY_SECONDS = 120  # a cold analysis worker on 2 shared cores
    org, _raw, client = make_client()
    cons = consent(client, tmp_path, "slt")
    prompt = pf.flite("slt", tmp_path / "ref-slt.wav")
    body = {
        "model": "voxcpm",
        "input": "Spoken in the reference's voice.",
        "ref_audio": data_url(prompt),
        "ref_text": pf.PROMPT_SENTENCE,
        "consent": cons,
        "response_format": "wav",
    }
    r = client.post("/v1/audio/speech", body, HTTP_IDEMPOTENCY_KEY="ref-audio-once")
    assert r.status_code == 200, r.content[:300]
    audio = b"".join(r.streaming_content)
    assert audio[:4] == b"RIFF"
    (job,) = SynthesisJob.objects.filter(organization=org)
    assert job.cloning_mode == "zero_shot" and job.status == SynthesisJob.Status.SUCCEEDED
    # Never stored past the job: the one-off voice and its prompt go as the job ends.
    wait_until(lambda: not Voice.objects.filter(organization=org).exists(), 30, "the one-off voice deleted")
    assert not list((Path(settings.MEDIA_ROOT) / "voices" / str(org.pk)).glob("*"))
    # Its consent keeps its recording: the next request naming it is checked against it again.
    assert VoiceConsent.objects.get(pk=cons.removeprefix("cons_")).recording_path
    # A retry under the same Idempotency-Key gets the same job, and makes no second voice of the audio.
    again = client.post("/v1/audio/speech", body, HTTP_IDEMPOTENCY_KEY="ref-audio-once")
    assert again.status_code == 200 and b"".join(again.streaming_content) == audio
    assert SynthesisJob.objects.filter(organization=org).count() == 1
    assert not Voice.objects.filter(organization=org).exists()

    # Another speaker's audio under slt's consent is refused by the analysis, and nothing is kept.
    other = {**body, "ref_audio": data_url(pf.flite("awb", tmp_path / "ref-awb.wav"))}
    refused = client.post("/v1/audio/speech", other)
    assert refused.status_code == 422, refused.content
    error = refused.json()["error"]
    assert error["code"] == "consent_mismatch" and error["param"] == "ref_audio", error
    assert not Voice.objects.filter(organization=org).exists()
    assert SynthesisJob.objects.filter(organization=org).count() == 1  # no job for the refused one


def test_a_voice_uploaded_as_vllm_omni_does_is_cloned_by_its_name_and_deleted_by_it(
    stack: TestStack, workers: None, voxcpm_voices: None, web: Any, tmp_path: Path
) -> None:
    """vLLM-Omni's voice surface (issue 56, item 1) through Nginx: multipart upload with a consent id
    and reference text, answered once the analysis made it usable; listed; spoken by its name (in
    any case) on /v1/audio/speech; deleted by its name."""
    import requests

    from tests.integration.api.conftest import base_url
    from webapp.speech.models import SynthesisJob, Voice

    org, raw, client = make_client()
    cons = consent(client, tmp_path, "slt")
    url, auth = base_url(web), {"Authorization": f"Bearer {raw}"}
    with open(pf.flite("slt", tmp_path / "upload-slt.wav"), "rb") as fh:
        r = requests.post(
            f"{url}/v1/audio/voices",
            files={"audio_sample": ("slt.wav", fh, "audio/wav")},
            data={
                "consent": cons,
                "name": "Stella",
                "ref_text": pf.PROMPT_SENTENCE,
                "speaker_description": "a clear, calm narrator",
            },
            headers=auth,
            verify=False,
            timeout=120,
        )
    assert r.status_code == 200, r.text[:500]
    assert r.json()["success"] is True
    voice = r.json()["voice"]
    # vLLM-Omni's voice is usable when its upload answers: the request waited for the analysis.
    assert voice["status"] == "ready", voice
    assert voice["name"] == "Stella" and voice["consent"] == cons and voice["ref_text"] == pf.PROMPT_SENTENCE
    assert voice["speaker_description"] == "a clear, calm narrator"
    assert voice["file_size"] > 0 and voice["mime_type"] == "audio/wav" and voice["created_at"] > 0

    listed = requests.get(f"{url}/v1/audio/voices", headers=auth, verify=False, timeout=30).json()
    assert {"Stella", "voxcpm:default"} <= set(listed["voices"])
    assert [v["name"] for v in listed["uploaded_voices"]] == ["Stella"]
    assert any(v["id"] == voice["id"] for v in listed["data"])  # ours, beside vLLM-Omni's lists

    spoken = requests.post(
        f"{url}/v1/audio/speech",
        json={
            "model": "voxcpm",
            "input": "Said by the uploaded voice.",
            "voice": "stella",
            "response_format": "wav",
        },
        headers=auth,
        verify=False,
        timeout=120,
    )
    assert spoken.status_code == 200 and spoken.content[:4] == b"RIFF", spoken.text[:300]
    (job,) = SynthesisJob.objects.filter(organization=org)
    assert job.voice_id == Voice.objects.get(voice_id=voice["id"]).pk and job.cloning_mode == "zero_shot"

    deleted = requests.delete(f"{url}/v1/audio/voices/Stella", headers=auth, verify=False, timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"success": True, "message": "Voice 'Stella' deleted successfully"}
    assert not Voice.objects.filter(voice_id=voice["id"]).exists()
    again = requests.delete(f"{url}/v1/audio/voices/Stella", headers=auth, verify=False, timeout=30)
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
