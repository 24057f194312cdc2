"""``seed`` through the API on the tiny VoxCPM in a real worker (issue 51): the same seed gives the
same audio, another seed other audio, on both wires; the sentence cache is off, so each job renders.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
import soundfile

from tests.integration.api.conftest import base_url, wait_finished
from tests.integration.voxcpm.conftest import worker_path
from tests.plugin_builds import make_client
from tests.reliability.helpers import flush_queues, start_worker
from tests.stack import TestStack

TEXT = "Hello there. Again."


@pytest.mark.django_db(transaction=True)
def test_the_same_seed_gives_the_same_audio_and_another_seed_other_audio(
    stack: TestStack, voxcpm_models: Path, voxcpm_site: Path, web: Any, no_session_worker: None
) -> None:
    from django.conf import settings

    from webapp.speech.models import SynthesisJob

    flush_queues(stack, "synth.voxcpm")
    worker = start_worker(
        stack,
        "voxcpm-seed",
        engines="voxcpm",
        PYTHONPATH=worker_path(voxcpm_site),
        TTS_MODELS_DIR=str(voxcpm_models),
    )
    try:
        _, raw_key, client = make_client()
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert models["voxcpm"]["capabilities"]["seed"] is True

        def native(seed: int) -> np.ndarray:
            body = {"text": TEXT, "voice": "voxcpm:default", "seed": seed, "cache": False}
            r = client.post("/api/v1/speech", body)
            assert r.status_code == 202, r.content
            done = wait_finished(client, r.json()["id"], timeout=90)
            assert done["status"] == "succeeded", done
            row = SynthesisJob.objects.get(pk=done["id"])
            assert row.params["seed"] == seed
            audio, _ = soundfile.read(Path(settings.MEDIA_ROOT) / row.audio_path, dtype="int16")
            return np.asarray(audio)

        first, again, other = native(7), native(7), native(8)
        assert np.array_equal(first, again)
        assert first.size != other.size or not np.array_equal(first, other)

        # The OpenAI body's seed: the same audio as the native job with that seed.
        body = {"model": "voxcpm", "voice": "default", "input": TEXT, "response_format": "wav"}
        answer = httpx2.post(
            f"{base_url(web)}/v1/audio/speech",
            json={**body, "seed": 7, "cache": False},
            headers={"Authorization": f"Bearer {raw_key}"},
            verify=False,
            timeout=90,
        )
        assert answer.status_code == 200, answer.text
        openai, _ = soundfile.read(io.BytesIO(answer.content), dtype="int16")
        assert np.array_equal(np.asarray(openai), first)
    finally:
        stack.stop_service(worker)
