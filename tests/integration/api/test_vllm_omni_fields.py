"""POST /v1/audio/speech and vLLM-Omni's request fields (issue 56, item 4): each is honoured or refused
with a 400 naming it, never dropped in silence (dropped, it would change the audio and still be
charged in full).

The field list is vLLM-Omni's own: its published wheel is installed in the agent clients'
virtualenv without its dependencies, and tests/clients/vllm_omni_fields.py reads its request
models from it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.api.conftest import base_url
from tests.reliability.helpers import PIPER, wait_until

ROOT = Path(__file__).resolve().parents[3]
TEXT = "Hello from a vLLM-Omni client."


@pytest.fixture(scope="module")
def vllm_omni_fields(clients_python: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(clients_python), str(ROOT / "tests" / "clients" / "vllm_omni_fields.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(done.stdout))


def serializer(**body: Any) -> Any:
    from webapp.speech.api.serializers import OpenAISpeechSerializer

    return OpenAISpeechSerializer(data={"input": TEXT, "voice": PIPER, **body})


def test_every_field_of_vllm_omnis_speech_request_is_honoured_or_refused_by_name(
    vllm_omni_fields: dict[str, Any],
) -> None:
    from webapp.speech.api.serializers import VLLM_OMNI_REFUSED, OpenAISpeechSerializer

    ours = set(OpenAISpeechSerializer().fields)
    theirs = {name for names in vllm_omni_fields["OpenAICreateSpeechRequest"].values() for name in names}
    assert vllm_omni_fields["version"] == "0.30.0"
    assert len(theirs) > 20  # the model was read, not an empty stand-in
    assert not theirs - ours - set(VLLM_OMNI_REFUSED), sorted(theirs - ours - set(VLLM_OMNI_REFUSED))
    assert not ours & set(VLLM_OMNI_REFUSED)  # a field is one or the other


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ref_audio_2", "data:audio/wav;base64,UklGRg=="),
        ("ambient_sound", "ocean waves"),
        ("duration_seconds", 4.0),
        ("x_vector_only_mode", True),
        ("speaker_embedding", [0.1, 0.2]),
        ("max_new_tokens", 100),
        ("initial_codec_chunk_frames", 4),
        ("non_streaming_mode", True),
        ("extra_params", {"top_k": 5}),
        ("word_timestamps", True),
    ],
)
def test_a_field_this_service_does_not_serve_is_a_400_naming_it(
    make_tenant: Any, field: str, value: Any
) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    r = tenant.client.post(
        "/v1/audio/speech", {"model": "tts-1", "input": TEXT, "voice": PIPER, field: value}
    )
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert not SynthesisJob.objects.filter(organization_id=tenant.org.pk).exists()  # nothing half-done


def test_a_refused_field_that_asks_for_nothing_is_accepted_and_so_are_nulls() -> None:
    s = serializer(ref_audio_2=None, x_vector_only_mode=False, word_timestamps=False, extra_params={})
    assert s.is_valid(), s.errors
    # vLLM-Omni's optional fields may come as null: each means "the default".
    nulls = {
        "model",
        "speed",
        "sample_rate",
        "seed",
        "instructions",
        "stream_format",
        "task_type",
        "language",
    }
    s = serializer(**dict.fromkeys(nulls))
    assert s.is_valid(), s.errors


def test_speaker_stream_task_type_and_language_are_honoured() -> None:
    from webapp.speech.api.openai import job_body

    s = serializer(voice=None, speaker=PIPER, stream=True, task_type="CustomVoice", language="Auto")
    assert s.is_valid(), s.errors
    assert s.validated_data["voice"] == PIPER  # speaker: vLLM-Omni's name for it
    assert s.validated_data["stream_format"] == "sse"  # stream=true without a format is SSE there
    body = job_body(s.validated_data)
    assert "language" not in body  # "Auto": the voice's own
    s = serializer(stream=True, stream_format="audio", language="en-us", model=None)
    assert s.is_valid(), s.errors
    assert s.validated_data["stream_format"] == "audio"
    body = job_body(s.validated_data)
    assert body["language"] == "en-us" and "engine" not in body  # no model: the voice's own


def test_voice_design_is_refused_and_a_missing_voice_is_named() -> None:
    s = serializer(task_type="VoiceDesign")
    assert not s.is_valid() and "task_type" in s.errors
    s = serializer(voice=None)
    assert not s.is_valid() and "voice" in s.errors


def test_a_whole_answer_carries_vllm_omnis_usage_headers(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent

    tenant = live_tenant()
    r = requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={"input": TEXT, "voice": PIPER, "response_format": "wav", "language": "en-us"},
        headers={"Authorization": f"Bearer {tenant.raw_key}"},
        verify=False,
        timeout=90,
    )
    assert r.status_code == 200, r.content[:300]
    (job,) = SynthesisJob.objects.filter(organization_id=tenant.org.pk)
    # The answer's settlement follows its last block (the headers came first, saying what it would be).
    charge = wait_until(
        lambda: UsageEvent.objects.filter(job_key=job.id, kind=UsageEvent.Kind.CHARGE).first(),
        30,
        "the charge",
    )
    charged = charge.characters
    assert charged == job.text_chars > 0
    assert r.headers["X-VLLM-OMNI-INPUT-TOKENS"] == r.headers["X-VLLM-OMNI-TOTAL-TOKENS"] == str(charged)
    assert r.headers["X-VLLM-OMNI-INPUT-TEXT-TOKENS"] == str(charged)
    assert r.headers["X-VLLM-OMNI-OUTPUT-TOKENS"] == r.headers["X-VLLM-OMNI-INPUT-AUDIO-TOKENS"] == "0"


def test_every_field_of_vllm_omnis_batch_request_and_item_is_taken_by_the_batch(
    vllm_omni_fields: dict[str, Any],
) -> None:
    from webapp.speech.api.openai_batch import ITEM_FIELDS

    batch = {name for names in vllm_omni_fields["BatchSpeechRequest"].values() for name in names}
    item = {name for names in vllm_omni_fields["SpeechBatchItem"].values() for name in names}
    assert {"items", "model"} <= batch and "input" in item  # the models were read
    # Each goes on to the item's /v1/audio/speech body, honoured or refused there by name.
    assert not batch - {"items", "model", *ITEM_FIELDS}, sorted(batch - {"items", "model", *ITEM_FIELDS})
    assert not item - {"input", *ITEM_FIELDS}, sorted(item - {"input", *ITEM_FIELDS})


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"ref_audio": "https://example.com/me.wav", "consent": "cons_x"}, "ref_audio", "invalid_request"),
        ({"ref_audio": "file:///etc/passwd", "consent": "cons_x"}, "ref_audio", "invalid_request"),
        (
            {"ref_audio": "data:audio/wav,RIFF-not-base64", "consent": "cons_x"},
            "ref_audio",
            "invalid_request",
        ),
        (
            {"ref_audio": "data:audio/wav;base64,@@not base64@@", "consent": "cons_x"},
            "ref_audio",
            "invalid_audio",
        ),
        ({"ref_text": "What the audio says."}, "ref_text", "invalid_request"),
        ({"ref_audio": "data:audio/wav;base64,UklGRg=="}, "consent", "consent_required"),
        ({"ref_audio": "data:audio/wav;base64,UklGRg==", "consent": "true"}, "consent", "consent_required"),
        ({"ref_audio": "data:audio/wav;base64,UklGRg==", "consent": "cons_0123"}, "consent", "invalid_id"),
        (
            {"ref_audio": "data:audio/wav;base64,UklGRg==", "consent": "cons_" + "0" * 32},
            "consent",
            "not_found",
        ),
    ],
)
def test_ref_audio_is_only_an_inline_data_url_under_a_recorded_consent(
    make_tenant: Any, body: dict[str, Any], param: str, code: str
) -> None:
    from webapp.speech.models import SynthesisJob, Voice

    tenant = make_tenant()
    r = tenant.client.post("/v1/audio/speech", {"model": "voxcpm", "input": TEXT, **body})
    assert 400 <= r.status_code < 500, r.content
    error = r.json()["error"]
    assert error["code"] == code and error["param"] == param, error
    # Nothing half-written: no voice, no job.
    assert not Voice.objects.filter(organization_id=tenant.org.pk).exists()
    assert not SynthesisJob.objects.filter(organization_id=tenant.org.pk).exists()
