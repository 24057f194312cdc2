"""POST /api/v1/voices: every upload limit with a real file, isolation, deletion, and the analysis end to end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from django.conf import settings

from tests import prompt_files as pf
from tests.integration.api.conftest import Tenant, problem, wait_finished

URL = "/api/v1/voices"


def upload(tenant: Tenant, path: Path, **fields: str) -> Any:
    data: dict[str, Any] = {"name": "My voice", "consent": "true", **fields}
    with open(path, "rb") as fh:
        data["audio"] = fh
        return tenant.client.client.post(URL, data, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")


def stored_prompts(tenant: Tenant) -> list[Path]:
    folder = Path(settings.MEDIA_ROOT) / "voices" / str(tenant.org.pk)
    return sorted(folder.glob("*")) if folder.exists() else []


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A good prompt (flite slt, about 6 s) and one file breaking each synchronous limit."""
    tmp = tmp_path_factory.mktemp("uploads")
    good = pf.flite("slt", tmp / "slt.wav")
    audio, rate = sf.read(good, dtype="float32")
    return {
        "good": good,
        "text": pf.renamed_text_file(tmp / "notes.wav"),
        "truncated": pf.truncated_header(tmp / "cut.wav", good),
        "nan": pf.nan_float_wav(tmp / "nan.wav"),
        "bomb": pf.flac_claiming_2_32_frames(tmp / "bomb.flac", good),
        "short": pf.write(tmp / "short.wav", audio[: rate * 2], rate),
        "long": pf.write(tmp / "long.wav", np.tile(audio, 3), rate),
        "8k": pf.eight_khz(tmp / "8k.wav", audio, rate),
        "noise": pf.noise(tmp / "noise.wav"),
    }


@pytest.mark.parametrize(
    ("name", "status", "codes"),
    [
        ("text", 415, {"unsupported_media_type"}),
        ("truncated", None, {"unsupported_media_type", "invalid_audio"}),
        ("nan", 400, {"invalid_audio"}),
        ("bomb", 400, {"audio_too_long"}),
        ("short", 400, {"audio_too_short"}),
        ("long", 400, {"audio_too_long"}),
        ("8k", 400, {"sample_rate_too_low"}),
    ],
)
def test_each_bad_file_gets_its_own_problem_and_nothing_is_stored(
    make_tenant: Callable[..., Tenant],
    prompts: dict[str, Path],
    name: str,
    status: int | None,
    codes: set[str],
) -> None:
    from webapp.speech.models import Voice

    tenant = make_tenant()
    response = upload(tenant, prompts[name])
    body = problem(response)
    assert body["code"] in codes, body
    assert response.status_code == (status or (415 if body["code"] == "unsupported_media_type" else 400))
    assert not Voice.objects.filter(organization=tenant.org).exists()
    assert stored_prompts(tenant) == []


def test_a_file_over_the_plans_upload_limit_is_413(
    make_tenant: Callable[..., Tenant], prompts: dict[str, Path]
) -> None:
    tenant = make_tenant(max_upload_bytes=50_000)
    assert prompts["good"].stat().st_size > 50_000
    response = upload(tenant, prompts["good"])
    assert response.status_code == 413 and problem(response)["code"] == "request_too_large"


def test_consent_is_required(make_tenant: Callable[..., Tenant], prompts: dict[str, Path]) -> None:
    response = upload(make_tenant(), prompts["good"], consent="false")
    assert response.status_code == 400 and problem(response)["code"] == "consent_required"


def test_zero_shot_is_unavailable_on_the_default_install(
    make_tenant: Callable[..., Tenant], builtin_voices: list[str], prompts: dict[str, Path]
) -> None:
    response = upload(make_tenant(), prompts["good"], cloning_mode="zero_shot")
    assert response.status_code == 422 and problem(response)["code"] == "cloning_unavailable"


def test_a_good_prompt_is_stored_canonical_under_a_generated_name_and_counts_against_the_plan(
    make_tenant: Callable[..., Tenant],
    prompts: dict[str, Path],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from webapp.speech.services import dispatch

    sent: list[str] = []
    monkeypatch.setattr(
        dispatch, "send_analysis", lambda pk: sent.append(str(pk))
    )  # no analysis worker in this test
    tenant = make_tenant(max_voices=1)
    hostile = prompts["good"].parent / "..%2F..%2Fetc%2Fpasswd.wav"
    hostile.write_bytes(prompts["good"].read_bytes())
    with django_capture_on_commit_callbacks(execute=True):
        response = upload(tenant, hostile)
    assert response.status_code == 202, response.content
    voice = response.json()
    assert voice["status"] == "processing" and voice["cloning_mode"] == "approximate"
    assert voice["consent"]["by"] and voice["consent"]["at"]
    assert response["Location"].endswith(voice["id"])
    (stored,) = stored_prompts(tenant)
    assert stored.name.endswith(".wav") and "passwd" not in stored.name
    info = sf.info(str(stored))
    assert info.samplerate == 16000 and info.channels == 1
    assert len(sent) == 1
    again = upload(tenant, prompts["good"])
    assert again.status_code == 409 and problem(again)["code"] == "quota_exceeded"


def test_another_tenant_cannot_see_use_or_delete_a_voice(
    make_tenant: Callable[..., Tenant], builtin_voices: list[str]
) -> None:
    from webapp.speech.models import Voice

    owner, other = make_tenant(), make_tenant()
    voice = _ready_voice(owner)
    assert owner.client.get(f"{URL}/{voice.voice_id}").status_code == 200
    assert other.client.get(f"{URL}/{voice.voice_id}").status_code == 404
    assert voice.voice_id not in [v["id"] for v in other.client.get(URL).json()["results"]]
    assert other.client.delete(f"{URL}/{voice.voice_id}").status_code == 404
    refused = other.client.post("/api/v1/speech", {"text": "Hello.", "voice": voice.voice_id})
    assert refused.status_code == 400 and problem(refused)["code"] == "unknown_voice"
    assert Voice.objects.filter(pk=voice.pk).exists()


def _ready_voice(tenant: Tenant, tmp: Path | None = None) -> Any:
    """An analysed uploaded voice row (approximate, speaking through Joe), with a prompt file."""
    import uuid

    from webapp.speech.models import Voice

    builtin = Voice.objects.get(voice_id="en_US-joe-medium")
    pk = uuid.uuid4()
    relative = f"voices/{tenant.org.pk}/{pk.hex}.wav"
    target = Path(settings.MEDIA_ROOT) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    sf.write(target, pf.tone(4.0), 16000)
    return Voice.objects.create(
        id=pk,
        voice_id=f"voice-{pk.hex}",
        organization=tenant.org,
        name="Ready voice",
        engine=builtin.engine,
        language=builtin.language,
        sample_rate=builtin.sample_rate,
        capabilities={**builtin.capabilities, "cloning": False},
        status=Voice.Status.READY,
        prompt_path=relative,
        cloning_mode="approximate",
        closest_voice=builtin.voice_id,
        pitch_shift=2.0,
        embedding=[0.1] * 256,
    )


def test_deleting_a_voice_fails_its_queued_jobs_and_removes_its_files(
    make_tenant: Callable[..., Tenant], builtin_voices: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, Voice

    tenant = make_tenant()
    voice = _ready_voice(tenant)
    prompt = Path(settings.MEDIA_ROOT) / voice.prompt_path
    request = lifecycle.JobRequest("Hello there.", voice, "wav", None, {"pitch": 1.0}, 12)
    job, _ = lifecycle.submit_job(
        tenant.org, request
    )  # queued: its dispatch waits for a commit that never comes
    assert job.cloning_mode == "approximate" and job.voice_name == "en_US-joe-medium"
    assert job.params["pitch"] == 3.0  # the request's own pitch plus the voice's shift
    with django_capture_on_commit_callbacks(execute=True):
        response = tenant.client.delete(f"{URL}/{voice.voice_id}")
    assert response.status_code == 204
    job.refresh_from_db()
    assert job.status == "failed" and job.error_code == "voice_deleted"
    assert not Voice.objects.filter(pk=voice.pk).exists()
    assert not prompt.exists()
    assert SynthesisJob.objects.filter(pk=job.pk, finished_at__isnull=False).exists()


# --------------------------------------------------------------------- end to end, with real workers


@pytest.fixture
def analysis_worker(stack: Any, django_db_setup: None) -> Iterator[Any]:
    service = stack.start_worker(
        "analysis", queues="analysis", env={"TTS_WORKER_ROLE": "analysis"}, wait_ready=False
    )
    yield service
    stack.stop_service(service)


def _wait_voice(tenant: Tenant, voice_id: str, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = tenant.client.get(f"{URL}/{voice_id}").json()
        if body["status"] != "processing" or time.monotonic() > deadline:
            return body
        time.sleep(1)


@pytest.mark.slow
def test_a_real_prompt_becomes_ready_and_speaks_through_the_closest_voice(
    live_tenant: Callable[..., Tenant],
    builtin_voices: list[str],
    analysis_worker: Any,
    prompts: dict[str, Path],
) -> None:
    tenant = live_tenant()
    noisy = upload(tenant, prompts["noise"], name="Noise")
    response = upload(tenant, prompts["good"], name="Stella", transcript=pf.PROMPT_SENTENCE)
    assert response.status_code == 202, response.content
    voice = _wait_voice(tenant, response.json()["id"])
    assert voice["status"] == "ready", voice
    assert len(voice["embedding"]) == 256
    assert 140 < voice["pitch"]["median_hz"] < 230  # slt is a female voice
    assert voice["speaks_with"]["voice"] in builtin_voices
    rejected = _wait_voice(tenant, noisy.json()["id"])
    assert rejected["status"] == "rejected" and rejected["rejected_code"] == "no_speech"
    assert rejected["embedding"] is None
    submitted = tenant.client.post(
        "/api/v1/speech", {"text": "A sentence the prompt never said.", "voice": voice["id"]}
    )
    assert submitted.status_code == 202, submitted.content
    job = wait_finished(tenant.client, submitted.json()["id"], timeout=120)
    assert job["status"] == "succeeded", job
    from webapp.speech.models import SynthesisJob

    row = SynthesisJob.objects.get(pk=job["id"])
    assert row.cloning_mode == "approximate" and row.voice_name == voice["speaks_with"]["voice"]


def test_an_upload_over_the_json_body_limit_but_within_the_upload_limit_is_accepted(
    make_tenant: Callable[..., Tenant],
    prompts: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import soxr

    from webapp.speech.services import dispatch

    monkeypatch.setattr(dispatch, "send_analysis", lambda pk: True)
    audio, rate = sf.read(prompts["good"], dtype="float32")
    loud = soxr.resample(np.tile(audio, 2)[: rate * 14], rate, 48000)
    big = pf.write(tmp_path / "big.wav", np.stack([loud, loud], axis=1), 48000)
    assert big.stat().st_size > 2 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    response = upload(make_tenant(), big)
    assert response.status_code == 202, response.content


def test_only_keys_that_may_manage_voices_see_a_voices_speaker_embedding(
    make_tenant: Callable[..., Tenant], builtin_voices: list[str]
) -> None:
    """An embedding is biometric data: a viewer (or a read-only key) sees the voice, not its embedding."""
    from tests.dashboard_data import member_of
    from tests.integration.api.conftest import ApiClient
    from webapp.tenants.services import OPERATOR, create_api_key

    tenant = make_tenant()
    voice = _ready_voice(tenant)
    assert len(tenant.client.get(f"{URL}/{voice.voice_id}").json()["embedding"]) == 256  # voices:write
    readers = []
    for role, scopes in (("viewer", ["speech:read"]), ("member", ["speech:read", "speech:write"])):
        person = member_of(tenant.org, f"{role}@example.com", role)
        readers.append(create_api_key(tenant.org, role, created_by=OPERATOR, user=person, scopes=scopes)[1])
    readers.append(create_api_key(tenant.org, "read-only", created_by=OPERATOR, scopes=["speech:read"])[1])
    for raw in readers:
        client = ApiClient(raw)
        one = client.get(f"{URL}/{voice.voice_id}").json()
        listed = next(v for v in client.get(URL).json()["results"] if v["id"] == voice.voice_id)
        for body in (one, listed):
            assert body["status"] == "ready" and body["pitch"] is not None
            assert "embedding" not in body, raw[:12]
