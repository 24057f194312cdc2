"""Word and sentence timestamps (issue 33, item 2): GET /api/v1/speech/{id}/timestamps, captions, SSE events.

Rows made directly test the endpoint's answers and errors in-process; the real worker and Piper
make the audio of the end-to-end ones (the time checks against an energy detector are in
tests/unit/synth/test_timestamps.py, on the engine's own audio).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import requests
import srt
import webvtt
from django.utils import timezone

from tests.integration.api.conftest import base_url, problem, wait_finished
from tests.integration.api.direct_jobs import job_row
from tests.integration.api.test_openai_sse import sse_events

TEXT = "Hello, world. It costs $42 today!"
WORDS = [
    {"text": "Hello", "start": 0.05, "end": 0.4, "char_start": 0, "char_end": 5},
    {"text": "world", "start": 0.6, "end": 1.0, "char_start": 7, "char_end": 12},
    {"text": "It", "start": 1.3, "end": 1.4, "char_start": 14, "char_end": 16},
    {"text": "costs", "start": 1.45, "end": 1.8, "char_start": 17, "char_end": 22},
    {"text": "$42", "start": 1.85, "end": 2.1, "char_start": 23, "char_end": 26, "spoken": "forty"},
    {"text": "$42", "start": 2.1, "end": 2.3, "char_start": 23, "char_end": 26, "spoken": "two"},
    {"text": "$42", "start": 2.35, "end": 2.7, "char_start": 23, "char_end": 26, "spoken": "dollars"},
    {"text": "today", "start": 2.75, "end": 3.1, "char_start": 27, "char_end": 32},
]
SENTENCES = [
    {"index": 0, "text": "Hello, world.", "start": 0.0, "end": 1.1, "char_start": 0, "char_end": 13},
    {"index": 1, "text": "It costs $42 today!", "start": 1.3, "end": 3.2, "char_start": 14, "char_end": 33},
]


def _finished_job(org: Any, **fields: Any) -> Any:
    from webapp.speech.models import JobTimestamps

    job = job_row(org, "succeeded", timezone.now(), chars=len(TEXT), engine="piper", duration_seconds=3.2)
    JobTimestamps.objects.create(job=job, words=WORDS, sentences=SENTENCES)
    return job


def _url(job: Any) -> str:
    return f"/api/v1/speech/{job.id}/timestamps"


def test_it_answers_the_words_and_sentences_as_json(make_tenant: Any) -> None:
    t = make_tenant()
    job = _finished_job(t.org)
    response = t.client.get(_url(job))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body == {"job_id": str(job.id), "duration_seconds": 3.2, "words": WORDS, "sentences": SENTENCES}
    assert response["Cache-Control"] == "private, no-store"


def test_it_answers_srt_and_vtt_captions_per_sentence_or_word(make_tenant: Any) -> None:
    t = make_tenant()
    job = _finished_job(t.org)
    response = t.client.get(_url(job), {"format": "srt"})
    assert response.status_code == 200 and response["Content-Type"].startswith("application/x-subrip")
    cues = list(srt.parse(response.content.decode()))
    assert [c.content for c in cues] == ["Hello, world.", "It costs $42 today!"]
    assert cues[1].start == dt.timedelta(seconds=1.3) and cues[1].end == dt.timedelta(seconds=3.2)
    response = t.client.get(_url(job), {"format": "vtt", "level": "word"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/vtt")
    captions = webvtt.from_string(response.content.decode()).captions
    assert [c.text for c in captions] == [w["text"] for w in WORDS]
    assert captions[4].start == "00:00:01.850" and captions[4].end == "00:00:02.100"


def test_it_refuses_a_caption_format_other_than_srt_vtt_or_json_with_400(make_tenant: Any) -> None:
    t = make_tenant()
    job = _finished_job(t.org)
    body = problem(t.client.get(_url(job), {"format": "txt"}))
    assert body["status"] == 400 and body["code"] == "unsupported_format" and body["field"] == "format"
    body = problem(t.client.get(_url(job), {"format": "srt", "level": "syllable"}))
    assert body["status"] == 400 and body["field"] == "level"


def test_a_queued_jobs_timestamps_are_409_an_expired_ones_410(make_tenant: Any) -> None:
    t = make_tenant()
    queued = job_row(t.org, "queued", timezone.now(), chars=5, engine="piper")
    body = problem(t.client.get(_url(queued)))
    assert body["status"] == 409 and body["code"] == "audio_not_ready"
    expired = job_row(t.org, "expired", timezone.now(), chars=5, engine="piper")
    body = problem(t.client.get(_url(expired)))
    assert body["status"] == 410 and body["code"] == "audio_expired"


def test_another_tenants_jobs_timestamps_are_404(make_tenant: Any) -> None:
    owner, other = make_tenant(), make_tenant()
    job = _finished_job(owner.org)
    body = problem(other.client.get(_url(job)))
    assert body["status"] == 404 and body["code"] == "not_found"
    captions = problem(other.client.get(_url(job), {"format": "srt"}))  # nothing of the owner's text
    assert captions["status"] == 404 and "Hello" not in str(captions)


def test_the_schema_describes_the_endpoint(make_tenant: Any) -> None:
    t = make_tenant()
    schema = t.client.get("/api/v1/schema", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/speech/{job_id}/timestamps"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert params["format"]["schema"]["enum"] == ["json", "srt", "vtt"]
    assert {"application/json", "application/x-subrip", "text/vtt"} <= set(
        operation["responses"]["200"]["content"]
    )
    assert {"400", "404", "409", "410"} <= set(operation["responses"])


def test_a_real_jobs_words_map_to_the_text_submitted_count_in_storage_and_expire_with_its_audio(
    live_tenant: Any,
) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import JobTimestamps, SynthesisJob
    from webapp.speech.services.ledger import storage_used

    t = live_tenant()
    response = t.client.post("/api/v1/speech", {"text": TEXT, "format": "mp3"})
    assert response.status_code in (200, 201, 202), response.content
    job_id = response.json()["id"]
    assert wait_finished(t.client, job_id)["status"] == "succeeded"
    body = t.client.get(f"/api/v1/speech/{job_id}/timestamps").json()
    words = body["words"]
    assert [w["text"] for w in words] == ["Hello", "world", "It", "costs", "$42", "$42", "$42", "today"]
    assert [w.get("spoken") for w in words[4:7]] == ["forty", "two", "dollars"]
    for w in words:
        assert TEXT[w["char_start"] : w["char_end"]] == w["text"]
    for a, b in zip(words, words[1:], strict=False):
        assert a["start"] < a["end"] <= b["start"] + 1e-6
    assert [s["text"] for s in body["sentences"]] == ["Hello, world.", "It costs $42 today!"]
    assert body["sentences"][-1]["end"] <= body["duration_seconds"] + 0.05
    # The rows are the tenant's storage too, beside the audio.
    job = SynthesisJob.objects.get(id=job_id)
    stored = JobTimestamps.objects.get(job_id=job_id)
    assert job.timestamps_bytes == len(json.dumps([stored.words, stored.sentences]).encode()) > 0
    assert storage_used(t.org) == job.audio_bytes + job.timestamps_bytes
    lifecycle.expire_audio(job_id, immediately=True)
    assert problem(t.client.get(f"/api/v1/speech/{job_id}/timestamps"))["status"] == 410
    assert not JobTimestamps.objects.filter(job_id=job_id).exists()
    assert storage_used(t.org) == 0


def test_sse_with_timestamps_sends_one_timestamps_event_per_sentence(live_tenant: Any, web: Any) -> None:
    t = live_tenant()
    text = "The first sentence is short. A second follows it. The third ends here."
    response = requests.post(
        f"{base_url(web)}/v1/audio/speech",
        json={
            "model": "gpt-4o-mini-tts",
            "voice": "alloy",
            "input": text,
            "response_format": "pcm",
            "stream_format": "sse",
            "timestamps": True,
        },
        headers={"Authorization": f"Bearer {t.raw_key}"},
        verify=False,
        timeout=90,
        stream=True,
    )
    assert response.status_code == 200, response.text
    events = list(sse_events(response.iter_content(chunk_size=None)))
    types = [e["type"] for e in events]
    assert types[-1] == "speech.audio.done" and types.count("speech.timestamps") == 3
    assert types[0] == "speech.audio.delta"  # a sentence's audio comes before its timestamps
    stamps = [e for e in events if e["type"] == "speech.timestamps"]
    assert [e["sentence"]["text"] for e in stamps] == [
        "The first sentence is short.",
        "A second follows it.",
        "The third ends here.",
    ]
    assert [w["text"] for w in stamps[1]["words"]] == ["A", "second", "follows", "it"]
    for e in stamps:
        for w in e["words"]:
            assert text[w["char_start"] : w["char_end"]] == w["text"]
    # The audio up to a sentence's event holds at least that sentence (24 kHz 16-bit PCM).
    heard = 0
    for e in events[:-1]:
        if e["type"] == "speech.audio.delta":
            heard += len(base64.b64decode(e["audio"]))
        else:
            assert heard / 2 / 24000 >= e["sentence"]["end"] - 0.05, (heard, e["sentence"])
    from webapp.speech.models import SynthesisJob

    job = SynthesisJob.objects.get(organization=t.org)
    stored = t.client.get(f"/api/v1/speech/{job.id}/timestamps").json()
    assert stored["sentences"] == [e["sentence"] for e in stamps]  # what the row published
    # The captions through Nginx too.
    vtt = requests.get(
        f"{base_url(web)}/api/v1/speech/{job.id}/timestamps",
        params={"format": "vtt"},
        headers={"Authorization": f"Bearer {t.raw_key}"},
        verify=False,
        timeout=30,
    )
    assert vtt.status_code == 200 and vtt.headers["Content-Type"].startswith("text/vtt")
    assert [c.text for c in webvtt.from_string(vtt.text).captions] == [e["sentence"]["text"] for e in stamps]


def test_timestamps_without_sse_are_400(make_tenant: Any) -> None:
    t = make_tenant()
    body = {"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "pcm", "timestamps": True}
    response = t.client.post("/v1/audio/speech", body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "timestamps"
