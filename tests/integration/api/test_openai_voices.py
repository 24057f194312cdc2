"""/v1/audio/voices as vLLM-Omni's clients use it (issue 56, item 1): list (``voices``,
``uploaded_voices`` beside our ``data``), upload (multipart ``audio_sample``, ``consent``, ``name``,
``ref_text``, ``speaker_description``), speak by the uploaded name, delete by name; tenant-scoped,
on our upload path (limits, decode sandbox, consent rules)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests import prompt_files as pf
from tests.integration.api.conftest import Tenant, base_url

URL = "/v1/audio/voices"


@pytest.fixture(autouse=True)
def no_analysis_wait(settings: Any) -> None:
    """In this process (no analysis runs for the test client's uploads) the upload answers at once;
    the web the live test talks to waits as configured."""
    settings.TTS_OPENAI_VOICE_READY_SECONDS = 0


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pf.flite("slt", tmp_path_factory.mktemp("vllm-voices") / "slt.wav")


def upload(tenant: Tenant, path: Path, **fields: str) -> Any:
    data: dict[str, Any] = {"name": "Stella", "consent": "true", **fields}
    with open(path, "rb") as fh:
        data["audio_sample"] = fh
        return tenant.client.client.post(URL, data, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")


@pytest.fixture
def analysis_worker(stack: Any, django_db_setup: None) -> Iterator[Any]:
    service = stack.start_worker(
        "analysis", queues="analysis", env={"TTS_WORKER_ROLE": "analysis"}, wait_ready=False
    )
    yield service
    stack.stop_service(service)


def test_a_voice_uploaded_as_vllm_omni_does_is_listed_spoken_by_name_and_deleted_by_name(
    live_tenant: Callable[..., Tenant], web: Any, analysis_worker: Any, sample: Path
) -> None:
    from webapp.speech.models import SynthesisJob, Voice

    tenant = live_tenant()
    url = base_url(web)
    auth = {"Authorization": f"Bearer {tenant.raw_key}"}
    t = time.monotonic()
    with open(sample, "rb") as fh:
        r = requests.post(
            f"{url}{URL}",
            files={"audio_sample": ("slt.wav", fh, "audio/wav")},
            data={
                "consent": "true",
                "name": "Stella",
                "ref_text": pf.PROMPT_SENTENCE,
                "speaker_description": "a clear, calm narrator",
            },
            headers=auth,
            verify=False,
            timeout=120,
        )
    assert r.status_code == 200, r.text[:500]
    answer = r.json()
    assert answer["success"] is True
    voice = answer["voice"]
    # vLLM-Omni answers once the voice is usable: the request waited for the analysis.
    assert voice["status"] == "ready", (voice, time.monotonic() - t)
    assert voice["name"] == "Stella" and voice["ref_text"] == pf.PROMPT_SENTENCE
    assert voice["speaker_description"] == "a clear, calm narrator"
    assert voice["file_size"] > 0 and voice["mime_type"] == "audio/wav" and voice["created_at"] > 0

    listed = requests.get(f"{url}{URL}", headers=auth, verify=False, timeout=30).json()
    assert "Stella" in listed["voices"] and "alloy" in listed["voices"]
    assert [v["name"] for v in listed["uploaded_voices"]] == ["Stella"]
    assert any(v["id"] == voice["id"] for v in listed["data"])  # ours, beside vLLM-Omni's lists

    # The uploaded name is the voice on /v1/audio/speech, in any case, as on vLLM-Omni.
    spoken = requests.post(
        f"{url}/v1/audio/speech",
        json={"input": "Said by the uploaded voice.", "voice": "stella", "response_format": "wav"},
        headers=auth,
        verify=False,
        timeout=120,
    )
    assert spoken.status_code == 200 and spoken.content[:4] == b"RIFF", spoken.text[:300]
    (job,) = SynthesisJob.objects.filter(organization_id=tenant.org.pk)
    assert job.voice_id == Voice.objects.get(voice_id=voice["id"]).pk

    deleted = requests.delete(f"{url}{URL}/Stella", headers=auth, verify=False, timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"success": True, "message": "Voice 'Stella' deleted successfully"}
    assert not Voice.objects.filter(voice_id=voice["id"]).exists()
    again = requests.delete(f"{url}{URL}/Stella", headers=auth, verify=False, timeout=30)
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"


def test_a_name_is_the_tenants_once_and_another_tenant_may_take_it(
    make_tenant: Callable[..., Tenant], sample: Path, builtin_voices: list[str]
) -> None:
    from webapp.speech.models import Voice

    first, second = make_tenant(), make_tenant()
    assert upload(first, sample).status_code == 200
    taken = upload(first, sample, name="STELLA")
    assert taken.status_code == 409, taken.content
    assert taken.json()["error"]["code"] == "voice_name_taken"
    assert Voice.objects.filter(organization=first.org).count() == 1  # nothing half-written
    assert upload(second, sample).status_code == 200
    # Another tenant's voice is not found by its name, nor deleted.
    assert first.client.delete(f"{URL}/Stella").status_code == 200
    assert Voice.objects.filter(organization=second.org, name="Stella").exists()


def test_vllm_omnis_free_text_consent_and_speaker_embeddings_are_refused_by_name(
    make_tenant: Callable[..., Tenant], sample: Path
) -> None:
    from webapp.speech.models import Voice

    tenant = make_tenant()
    r = upload(tenant, sample, consent="user-42-agreed")
    assert r.status_code == 400 and r.json()["error"]["param"] == "consent", r.content
    r = tenant.client.client.post(
        URL,
        {"name": "Embedded", "consent": "true", "speaker_embedding": "[0.1, 0.2]"},
        HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}",
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "speaker_embedding", r.content
    r = tenant.client.client.post(
        URL, {"name": "No audio", "consent": "true"}, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}"
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "audio_sample", r.content
    assert not Voice.objects.filter(organization=tenant.org).exists()


def test_a_key_without_voices_write_may_list_but_not_upload_or_delete(
    make_tenant: Callable[..., Tenant], sample: Path
) -> None:
    tenant = make_tenant(scopes=["speech:read", "speech:write"])
    assert tenant.client.get(URL).status_code == 200
    assert upload(tenant, sample).status_code == 403
    assert tenant.client.delete(f"{URL}/Stella").status_code == 403
