"""The VoxCPM engine in a real worker of `make run`'s stack (issue 51): a job streams and completes;
a missing or corrupt model directory makes the engine unavailable (503 engine_unavailable).
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import soundfile
from safetensors.torch import load_file, save_file

from synth import models
from tests.integration.api.conftest import base_url, problem, wait_finished
from tests.integration.voxcpm.conftest import worker_path
from tests.plugin_builds import make_client
from tests.reliability.helpers import flush_queues, start_worker
from tests.stack import TestStack


def wait_unavailable(stack: TestStack, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        beats = [b for b in stack.heartbeats() if "voxcpm" in (b.get("unavailable") or {})]
        if beats:
            return beats[0]
        assert time.monotonic() < deadline, stack.heartbeats()
        time.sleep(0.3)


@pytest.mark.django_db(transaction=True)
def test_a_job_on_the_voxcpm_model_streams_and_completes(
    stack: TestStack, voxcpm_models: Path, voxcpm_site: Path, web: Any, no_session_worker: None
) -> None:
    from django.conf import settings

    from webapp.speech.models import SynthesisJob

    flush_queues(stack, "synth.voxcpm")
    worker = start_worker(
        stack,
        "voxcpm-w1",
        engines="voxcpm",
        PYTHONPATH=worker_path(voxcpm_site),
        TTS_MODELS_DIR=str(voxcpm_models),
    )
    try:
        _, raw_key, client = make_client()
        r = client.post(
            "/api/v1/speech", {"text": "Hello there. Again.", "voice": "voxcpm:default", "sample_rate": 16000}
        )
        assert r.status_code == 202, r.content
        done = wait_finished(client, r.json()["id"], timeout=90)
        assert done["status"] == "succeeded", done
        row = SynthesisJob.objects.get(pk=done["id"])
        audio, rate = soundfile.read(Path(settings.MEDIA_ROOT) / row.audio_path, dtype="float32")
        assert rate == 16000 and len(audio) >= 2 * 2560  # two sentences of whole 0.16 s patches, resampled
        assert row.metrics["model"] == "voxcpm" and row.metrics["model_checksum"].startswith("sha256:")

        body = {"model": "voxcpm", "voice": "default", "input": "One. Two.", "response_format": "wav"}
        answer = httpx2.post(
            f"{base_url(web)}/v1/audio/speech",
            json={**body, "stream_format": "audio"},
            headers={"Authorization": f"Bearer {raw_key}"},
            verify=False,
            timeout=90,
        )
        assert answer.status_code == 200, answer.text
        assert "content-length" not in answer.headers  # chunked: sentence by sentence
        streamed, rate = soundfile.read(io.BytesIO(answer.content))
        assert rate == 48000 and len(streamed) >= 2 * 7680
    finally:
        stack.stop_service(worker)


@pytest.mark.django_db(transaction=True)
def test_a_missing_or_corrupt_model_directory_gives_engine_unavailable(
    stack: TestStack, voxcpm_models: Path, voxcpm_site: Path, tmp_path: Path, no_session_worker: None
) -> None:
    flush_queues(stack, "synth.voxcpm", "synth.espeak")
    _, _, client = make_client()
    for case in ("missing", "corrupt"):
        root = tmp_path / case
        root.mkdir()
        if case == "corrupt":  # verified, then its first LM layer removed and the record rewritten to match
            directory = shutil.copytree(voxcpm_models / "voxcpm", root / "voxcpm")
            state = load_file(str(directory / "model.safetensors"))
            save_file(
                {k: v for k, v in state.items() if ".layers.0." not in k},
                str(directory / "model.safetensors"),
            )
            report = models.Report("voxcpm", checksum=models.checksum(directory))
            models.record(directory, report)
        worker = start_worker(
            stack,
            f"voxcpm-{case}",
            engines="espeak,voxcpm",
            PYTHONPATH=worker_path(voxcpm_site),
            TTS_MODELS_DIR=str(root),
        )
        try:
            beat = wait_unavailable(stack)
            reason = beat["unavailable"]["voxcpm"]
            assert ("no model directory" if case == "missing" else "does not match the model") in reason, (
                reason
            )
            assert beat["engines"] == ["espeak"]
            r = client.post("/api/v1/speech", {"text": "Hello.", "engine": "voxcpm"})
            assert r.status_code == 503 and problem(r)["code"] == "engine_unavailable", r.content
        finally:
            stack.stop_service(worker)
        deadline = time.monotonic() + 15
        while any("voxcpm" in (b.get("unavailable") or {}) for b in stack.heartbeats()):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert json.loads((tmp_path / "corrupt" / "voxcpm" / models.RECORD).read_text())["checksum"]
