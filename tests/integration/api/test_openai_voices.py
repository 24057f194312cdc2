"""/v1/audio/voices as vLLM-Omni's clients use it (issue 56, item 1): the refusals, tenant scope and
scopes of its upload and deletion, on our upload path (limits, decode sandbox, consent rules).

The whole round trip (upload through Nginx, waited for the analysis, listed, cloned by its name,
deleted by name) runs with the VoxCPM worker that clones it: tests/integration/voxcpm/
test_consented_cloning.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import prompt_files as pf
from tests.integration.api.conftest import Tenant

URL = "/v1/audio/voices"


@pytest.fixture(autouse=True)
def no_analysis_wait(settings: Any) -> None:
    """No analysis worker runs for these uploads (their transaction never commits): the upload
    answers at once, its voice ``processing``."""
    settings.TTS_OPENAI_VOICE_READY_SECONDS = 0


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pf.flite("slt", tmp_path_factory.mktemp("vllm-voices") / "slt.wav")


def upload(tenant: Tenant, path: Path, **fields: str) -> Any:
    data: dict[str, Any] = {"name": "Stella", "consent": "true", **fields}
    with open(path, "rb") as fh:
        data["audio_sample"] = fh
        return tenant.client.client.post(URL, data, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")


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
