"""tests/upstream/server.py, the fake vLLM-Omni server, run as the remote engine's tests will run it: a
process of the agent clients' interpreter (.venv-clients) on a spare loopback port, driven over HTTP.

No database and no test stack: these tests start only that server.
"""

from __future__ import annotations

import base64
import io
import json
import math
import struct
import threading
import time
import wave
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.upstream.harness import Upstream, prepare_clients, start_upstream

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
RATE = 24000
THREE_SENTENCES = "The first sentence is here. Then a second one follows! And is this the third?"
DEFAULT_SWITCHES = {
    "fail_5xx": False,
    "hang": False,
    "wrong_content_type": False,
    "capacity": None,
    "chunk_delay_ms": 0,
    "reject_unknown_fields": True,
    "registration_policy": "overwrite",
}


@pytest.fixture(scope="module")
def clients_python() -> Path:
    return prepare_clients()


@pytest.fixture(scope="module")
def upstream(clients_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    server = start_upstream(tmp_path_factory.mktemp("upstream") / "server.log", "--replica", "replica-a")
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()


@pytest.fixture(autouse=True)
def default_switches(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").control(**DEFAULT_SWITCHES)


def wait_for(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def pcm_samples(pcm: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(pcm) // 2}h", pcm))


def rms(samples: list[int]) -> float:
    return math.sqrt(sum(s * s for s in samples) / max(1, len(samples)))


def tone_wav(seconds: float) -> bytes:
    """A 440 Hz tone: a reference sample to upload."""
    frames = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * n / RATE)))
        for n in range(int(seconds * RATE))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(frames)
    return buffer.getvalue()


def sse_events(body: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix("data: "))
        for line in body.decode().splitlines()
        if line.startswith("data: ")
    ]


def test_health_and_models_carry_the_replica_name(upstream: Upstream) -> None:
    health = requests.get(f"{upstream.url}/health", timeout=5)
    assert health.status_code == 200
    assert health.headers["X-Upstream-Replica"] == "replica-a"
    models = requests.get(f"{upstream.url}/v1/models", timeout=5)
    assert models.json()["object"] == "list"
    assert [m["id"] for m in models.json()["data"]] == ["cosyvoice3"]
    assert models.headers["X-Upstream-Replica"] == "replica-a"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi.", "voise": "alloy"}, "body.voise"),
        ({"input": "Hi.", "speed": 9}, "body.speed"),
        ({"input": "Hi.", "response_format": "ogg"}, "body.response_format"),
        ({"voice": "alloy"}, "body.input"),
    ],
)
def test_a_body_vllm_omnis_models_refuse_is_a_400_naming_the_field(
    upstream: Upstream, body: dict[str, Any], param: str
) -> None:
    response = upstream.speech(body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert param.removeprefix("body.") in error["message"]
    assert error["code"] == 400
    assert set(error) == {"message", "type", "param", "code"}
    assert upstream.record(response.headers["X-Request-Id"])["status"] == 400


def test_unknown_voice_and_model_are_refused_as_vllm_omni_refuses_them(upstream: Upstream) -> None:
    voice = upstream.speech({"input": "Hi.", "voice": "nobody"})
    assert voice.status_code == 400
    assert voice.json()["error"]["type"] == "BadRequestError"
    assert "Invalid voice 'nobody'" in voice.json()["error"]["message"]
    model = upstream.speech({"input": "Hi.", "model": "other-model"})
    assert model.status_code == 404
    assert model.json()["error"] == {
        "message": "The model `other-model` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


def test_pcm_is_whole_16_bit_speech_with_usage_headers(upstream: Upstream) -> None:
    text = "Hello there, this is the fake upstream speaking."
    response = upstream.speech({"input": text, "voice": "vivian", "response_format": "pcm"})
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "audio/pcm"
    assert len(response.content) % 2 == 0
    seconds = len(response.content) / 2 / RATE
    assert 1.0 < seconds < 8.0, seconds  # eight words
    assert rms(pcm_samples(response.content)) > 300  # speech, not silence
    assert int(response.headers["X-VLLM-OMNI-TOTAL-TOKENS"]) > 0
    record = upstream.record(response.headers["X-Request-Id"])
    assert record["body"]["input"] == text
    assert (record["status"], record["finished"], record["client_closed"]) == (200, True, False)
    assert record["bytes_sent"] == len(response.content)


def test_wav_is_a_24_khz_mono_16_bit_file(upstream: Upstream) -> None:
    response = upstream.speech({"input": "A short WAV answer.", "response_format": "wav"})
    assert response.headers["Content-Type"] == "audio/wav"
    with wave.open(io.BytesIO(response.content)) as audio:
        assert (audio.getframerate(), audio.getnchannels(), audio.getsampwidth()) == (RATE, 1, 2)
        assert audio.getnframes() > RATE // 2


def test_streamed_pcm_arrives_a_sentence_at_a_time_after_the_delay(upstream: Upstream) -> None:
    upstream.control(chunk_delay_ms=150)
    body = {"input": THREE_SENTENCES, "response_format": "pcm", "stream": True, "stream_format": "audio"}
    started = time.monotonic()
    arrivals: list[tuple[float, int]] = []
    with upstream.speech(body, stream=True) as response:
        assert response.headers["Content-Type"] == "audio/pcm"
        for chunk in response.iter_content(chunk_size=None):
            arrivals.append((time.monotonic() - started, len(chunk)))
    assert len(arrivals) > 1
    assert arrivals[-1][0] >= 3 * 0.150  # a pause before each of the three sentences
    record = upstream.record(response.headers["X-Request-Id"])
    assert (record["chunks_sent"], record["finished"]) == (3, True)
    assert record["bytes_sent"] == sum(size for _, size in arrivals)


def test_sse_deltas_end_with_speech_audio_done(upstream: Upstream) -> None:
    response = upstream.speech({"input": THREE_SENTENCES, "response_format": "pcm", "stream": True})
    assert response.headers["Content-Type"] == "text/event-stream"
    events = sse_events(response.content)
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert all(base64.b64decode(e["audio"]) for e in events[:-1])
    assert events[-1]["usage"]["total_tokens"] > 0


def test_voices_upload_list_speak_and_delete(upstream: Upstream) -> None:
    voices = requests.get(f"{upstream.url}/v1/audio/voices", timeout=5).json()
    assert {"alloy", "vivian"} <= set(voices["voices"])

    def upload(name: str, seconds: float = 1.5) -> requests.Response:
        return requests.post(
            f"{upstream.url}/v1/audio/voices",
            files={"audio_sample": ("sample.wav", tone_wav(seconds), "audio/wav")},
            data={"consent": "consent-1", "name": name, "ref_text": "A tone."},
            timeout=5,
        )

    uploaded = upload("Narrator")
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["success"] is True
    voice = uploaded.json()["voice"]
    assert {"name", "consent", "created_at", "mime_type", "file_size"} <= set(voice)
    assert (voice["name"], voice["mime_type"], voice["ref_text"]) == ("Narrator", "audio/wav", "A tone.")
    listed = requests.get(f"{upstream.url}/v1/audio/voices", timeout=5).json()
    assert "narrator" in listed["voices"]
    assert [v["name"] for v in listed["uploaded_voices"]] == ["Narrator"]
    assert upstream.speech({"input": "Cloned.", "voice": "narrator"}).status_code == 200

    assert upload("Narrator").status_code == 200  # vLLM-Omni's default policy overwrites
    upstream.control(registration_policy="immutable")
    again = upload("Narrator")
    assert again.status_code == 400
    assert "already exists" in again.json()["error"]["message"]
    assert upload("vivian").status_code == 400  # a preset's name is reserved
    assert upload("short", seconds=0.3).status_code == 400

    deleted = requests.delete(f"{upstream.url}/v1/audio/voices/Narrator", timeout=5)
    assert deleted.json() == {"success": True, "message": "Voice 'Narrator' deleted successfully"}
    gone = requests.delete(f"{upstream.url}/v1/audio/voices/Narrator", timeout=5)
    assert gone.status_code == 404
    assert gone.json()["error"]["type"] == "NotFoundError"


def test_reference_audio_is_accepted_and_recorded_by_its_length(upstream: Upstream) -> None:
    ref_audio = "data:audio/wav;base64," + base64.b64encode(tone_wav(1.0)).decode()
    body = {
        "input": "Speak like the sample.",
        "ref_audio": ref_audio,
        "ref_text": "A tone.",
        "task_type": "Base",
    }
    response = upstream.speech(body)
    assert response.status_code == 200
    recorded = upstream.record(response.headers["X-Request-Id"])["body"]
    assert recorded["ref_audio"] == {"length": len(ref_audio)}
    assert recorded["ref_text"] == "A tone."


def test_batch_answers_each_item(upstream: Upstream) -> None:
    body = {
        "items": [{"input": "First item."}, {"input": "Second item.", "voice": "nobody"}],
        "voice": "alloy",
    }
    response = requests.post(f"{upstream.url}/v1/audio/speech/batch", json=body, timeout=10)
    assert response.status_code == 200
    batch = response.json()
    assert (batch["total"], batch["succeeded"], batch["failed"]) == (2, 1, 1)
    first, second = batch["results"]
    assert (first["index"], first["status"], first["media_type"]) == (0, "success", "audio/wav")
    assert base64.b64decode(first["audio_data"])[:4] == b"RIFF"
    assert first["usage"]["output_tokens"] > 0
    assert (second["index"], second["status"]) == (1, "error")
    assert "Invalid voice" in second["error"]
    assert "audio_data" not in second


def test_fail_5xx_answers_500_in_vllms_error_shape(upstream: Upstream) -> None:
    upstream.control(fail_5xx=True)
    response = upstream.speech({"input": "Hi."})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == 500
    assert response.json()["error"]["type"] == "InternalServerError"


def test_wrong_content_type_answers_200_html(upstream: Upstream) -> None:
    upstream.control(wrong_content_type=True)
    response = upstream.speech({"input": "Hi.", "response_format": "pcm"})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")


def test_capacity_refuses_the_request_past_it_with_503(upstream: Upstream) -> None:
    upstream.control(capacity=1, chunk_delay_ms=200)
    body = {"input": THREE_SENTENCES, "response_format": "pcm", "stream": True, "stream_format": "audio"}
    first: dict[str, Any] = {}

    def slow() -> None:
        with upstream.speech(body, stream=True) as response:
            first.update(status=response.status_code, size=len(response.content))

    thread = threading.Thread(target=slow)
    thread.start()
    wait_for(lambda: upstream.stats()["in_flight"] == 1)
    second = upstream.speech(body)
    thread.join(timeout=10)
    assert second.status_code == 503
    assert second.json()["error"]["code"] == 503
    assert first["status"] == 200 and first["size"] > 0
    assert upstream.stats()["in_flight"] == 0


def test_hang_sends_no_audio_until_the_client_gives_up(upstream: Upstream) -> None:
    upstream.control(hang=True)
    with pytest.raises(requests.ReadTimeout):
        upstream.speech({"input": "Hi.", "response_format": "pcm"}, timeout=(2, 0.5))
    # A stream sends its headers, then nothing.
    body = {"input": "Hi.", "response_format": "pcm", "stream": True, "stream_format": "audio"}
    with upstream.speech(body, stream=True, timeout=(2, 0.5)) as response:
        assert response.status_code == 200
        with pytest.raises(requests.ConnectionError):  # requests' word for a read timeout mid-body
            next(response.iter_content(chunk_size=1))
    wait_for(lambda: upstream.stats()["in_flight"] == 0)
    whole, streamed = upstream.stats()["requests"][-2:]
    assert (whole["status"], whole["finished"], whole["client_closed"]) == (None, False, True)
    assert (streamed["status"], streamed["chunks_sent"], streamed["client_closed"]) == (200, 0, True)


def test_a_client_leaving_a_slow_stream_shows_as_client_closed(upstream: Upstream) -> None:
    upstream.control(chunk_delay_ms=300)
    body = {"input": THREE_SENTENCES, "response_format": "pcm", "stream": True, "stream_format": "audio"}
    with upstream.speech(body, stream=True) as response:
        next(response.iter_content(chunk_size=None))
        request_id = response.headers["X-Request-Id"]
    wait_for(lambda: upstream.record(request_id)["client_closed"])
    record = upstream.record(request_id)
    assert record["finished"] is False
    assert 1 <= record["chunks_sent"] < 3


def test_the_api_key_guards_v1_only(clients_python: Path, tmp_path: Path) -> None:
    server = start_upstream(tmp_path / "server.log", "--replica", "keyed", "--api-key", "sekrit")
    try:
        models = f"{server.url}/v1/models"
        assert requests.get(models, timeout=5).status_code == 401
        wrong = requests.get(models, headers={"Authorization": "Bearer nope"}, timeout=5)
        assert (wrong.status_code, wrong.json()) == (401, {"error": "Unauthorized"})
        assert wrong.headers["X-Upstream-Replica"] == "keyed"
        assert requests.get(models, headers={"Authorization": "Bearer sekrit"}, timeout=5).status_code == 200
        for path in ("/health", "/_control", "/_stats"):
            assert requests.get(f"{server.url}{path}", timeout=5).status_code == 200
    finally:
        assert server.stop() == 0, server.log.read_text()
