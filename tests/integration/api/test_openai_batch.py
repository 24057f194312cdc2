"""POST /v1/audio/speech/batch (issue 56, item 3): vLLM-Omni's batch, each item a job with its own
charge, errors per item in vLLM-Omni's shape, bounded in characters and in answer size."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import requests

from tests.integration.api.conftest import base_url
from tests.reliability.helpers import ESPEAK, LONG, PIPER, wait_until
from tests.stack import tcp_gunicorn


def post_batch(
    url: str, key: str, body: dict[str, Any], timeout: float = 120, headers: dict[str, str] | None = None
) -> requests.Response:
    return requests.post(
        f"{url}/v1/audio/speech/batch",
        json=body,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
        verify=False,
        timeout=timeout,
    )


def charges(org_id: Any) -> dict[Any, int]:
    from webapp.speech.models import UsageEvent

    return dict(
        UsageEvent.objects.filter(organization_id=org_id, kind=UsageEvent.Kind.CHARGE).values_list(
            "job_key", "characters"
        )
    )


def test_each_item_is_a_job_of_its_own_answered_in_vllm_omnis_shape(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    body: dict[str, Any] = {
        "voice": PIPER,  # the batch's: items may name their own
        "items": [
            {"input": "The first item, in the batch's voice."},
            {
                "input": "The second item, as mp3 in eSpeak's voice.",
                "voice": ESPEAK,
                "response_format": "mp3",
            },
            {"input": "The third names a voice nobody has.", "voice": "no-such-voice"},
            {"input": "The fourth asks for a field this service refuses.", "max_new_tokens": 5},
        ],
    }
    r = post_batch(base_url(web), tenant.raw_key, body)
    assert r.status_code == 200, r.text[:500]
    answer = r.json()
    assert answer["id"].startswith("speech-batch-")
    assert (answer["total"], answer["succeeded"], answer["failed"]) == (4, 2, 2)
    first, second, third, fourth = answer["results"]
    assert [x["index"] for x in answer["results"]] == [0, 1, 2, 3]
    wav = base64.b64decode(first["audio_data"])
    assert first["status"] == "success" and first["media_type"] == "audio/wav" and wav[:4] == b"RIFF"
    mp3 = base64.b64decode(second["audio_data"])
    assert second["media_type"] == "audio/mpeg" and (mp3[:3] == b"ID3" or mp3[0] == 0xFF)
    # vLLM-Omni leaves out what an item lacks: no error on a success, no audio on an error.
    assert "error" not in first and "audio_data" not in third
    assert third["status"] == fourth["status"] == "error"
    assert "no-such-voice" in third["error"] and "max_new_tokens" in fourth["error"]

    jobs = {j.text: j for j in SynthesisJob.objects.filter(organization_id=tenant.org.pk)}
    assert len(jobs) == 2  # the refused items left nothing behind
    assert {j.voice_name for j in jobs.values()} == {PIPER, ESPEAK}
    charged = wait_until(lambda: len(c := charges(tenant.org.pk)) == 2 and c, 30, "both charges")
    for item, result in ((body["items"][0], first), (body["items"][1], second)):
        job = jobs[item["input"]]
        assert charged[job.id] == job.text_chars == result["usage"]["input_tokens"] > 0


def test_a_retry_with_the_same_idempotency_key_gets_the_same_jobs_charged_once(
    live_tenant: Any, web: Any
) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    body = {"voice": ESPEAK, "items": [{"input": "One."}, {"input": "Two."}]}
    key = str(uuid.uuid4())
    first = post_batch(base_url(web), tenant.raw_key, body, headers={"Idempotency-Key": key})
    again = post_batch(base_url(web), tenant.raw_key, body, headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 200, (first.text[:300], again.text[:300])
    assert again.json()["succeeded"] == 2
    assert [r["audio_data"] for r in again.json()["results"]] == [
        r["audio_data"] for r in first.json()["results"]
    ]
    assert SynthesisJob.objects.filter(organization_id=tenant.org.pk).count() == 2
    assert len(wait_until(lambda: len(c := charges(tenant.org.pk)) == 2 and c, 30, "the charges")) == 2


def test_an_answer_over_the_size_limit_is_a_413_and_charges_nothing(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent

    tenant = live_tenant()
    body = {"voice": ESPEAK, "items": [{"input": "This answer is far larger than a thousand bytes."}]}
    with tcp_gunicorn(web, "web-small-batches", TTS_OPENAI_BATCH_MAX_BYTES="1000") as port:
        r = post_batch(f"http://127.0.0.1:{port}", tenant.raw_key, body)
    assert r.status_code == 413, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "request_too_large" and "Nothing was charged" in error["message"]
    (job,) = SynthesisJob.objects.filter(organization_id=tenant.org.pk)
    # Synthesised, then never handed: it ends as one its client left (the audio removed, not charged).
    assert job.status == SynthesisJob.Status.EXPIRED and job.finished_at is not None
    released = wait_until(
        lambda: UsageEvent.objects.filter(job_key=job.id, kind=UsageEvent.Kind.RELEASE).exists(),
        30,
        "release",
    )
    assert released and not charges(tenant.org.pk)


def test_a_client_that_leaves_mid_batch_abandons_every_job_and_is_charged_nothing(
    live_tenant: Any, web: Any
) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    # Uncached (another test may have cached LONG's sentences): each item takes seconds to make.
    body = {
        "voice": PIPER,
        "cache": False,
        "items": [{"input": f"{LONG} {LONG}"}, {"input": f"{LONG} Again."}],
    }
    try:
        r = post_batch(base_url(web), tenant.raw_key, body, timeout=1.5)
        raise AssertionError(f"the batch answered within 1.5 s: {r.status_code} {r.text[:300]}")
    except requests.exceptions.ReadTimeout:
        pass
    # The client left while its jobs were still being made (the fault overlapped the work).
    assert (
        SynthesisJob.objects.filter(organization_id=tenant.org.pk)
        .exclude(status__in=SynthesisJob.FINISHED)
        .exists()
    )
    wait_until(
        lambda: (
            SynthesisJob.objects.filter(
                organization_id=tenant.org.pk, status__in=SynthesisJob.FINISHED
            ).count()
            == 2
        ),
        60,
        "both jobs ended",
    )
    statuses = set(
        SynthesisJob.objects.filter(organization_id=tenant.org.pk).values_list("status", flat=True)
    )
    assert statuses <= {SynthesisJob.Status.CANCELED, SynthesisJob.Status.EXPIRED}, statuses
    assert not charges(tenant.org.pk)


def test_a_batch_past_the_plans_characters_per_request_is_a_413_that_submits_nothing(
    make_tenant: Any,
) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant(max_characters_per_request=40)
    body: dict[str, Any] = {
        "voice": PIPER,
        "items": [{"input": "Twenty-five characters.."}, {"input": "And twenty-five more...."}],
    }
    r = tenant.client.post("/v1/audio/speech/batch", body)
    assert r.status_code == 413, r.content
    error = r.json()["error"]
    assert error["param"] == "items" and "48 characters" in error["message"]
    assert not SynthesisJob.objects.filter(organization_id=tenant.org.pk).exists()


def test_a_batch_that_is_not_one_is_a_400_naming_items(make_tenant: Any) -> None:
    tenant = make_tenant()
    for body in (
        {"voice": PIPER},
        {"voice": PIPER, "items": []},
        {"voice": PIPER, "items": [{"input": "x"}] * 33},
        {"voice": PIPER, "items": [{"text": "no input"}]},
        {"voice": PIPER, "items": "not a list"},
    ):
        r = tenant.client.post("/v1/audio/speech/batch", body)
        assert r.status_code == 400, (body, r.content)
        assert r.json()["error"]["param"] == "items"


def test_a_batch_whose_every_item_is_refused_answers_at_once(make_tenant: Any, queued_only: None) -> None:
    tenant = make_tenant()
    r = tenant.client.post(
        "/v1/audio/speech/batch", {"items": [{"input": "No voice."}, {"input": "Nor here.", "speed": 9}]}
    )
    assert r.status_code == 200, r.content
    answer = r.json()
    assert (answer["succeeded"], answer["failed"]) == (0, 2)
    assert "voice" in answer["results"][0]["error"] and "speed" in answer["results"][1]["error"]
