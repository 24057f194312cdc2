"""``loudness``: the API's target integrated loudness, measured on the audio it returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyloudnorm
import pytest
import soundfile

from tests.integration.api.conftest import problem, wait_finished

TEXT = "Loudness is measured over the whole programme. This sentence gives the meter enough to hear."


def _measured_lufs(path: str) -> float:
    data, rate = soundfile.read(path, dtype="float64")
    return float(pyloudnorm.Meter(rate).integrated_loudness(np.asarray(data)))


@pytest.mark.parametrize("target", [-16.0, -30.0])
def test_the_returned_audio_has_the_loudness_asked_for(live_tenant: Any, target: float) -> None:
    from django.conf import settings

    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    created = t.client.post("/api/v1/speech", {"text": TEXT, "format": "wav", "loudness": target})
    assert created.status_code == 202, created.content
    assert wait_finished(t.client, created.json()["id"], timeout=120)["status"] == "succeeded"
    job = SynthesisJob.objects.get(id=created.json()["id"])
    assert job.params["loudness"] == target
    assert _measured_lufs(str(settings.MEDIA_ROOT / job.audio_path)) == pytest.approx(target, abs=1.0)


@pytest.mark.parametrize("value", [-41, -4.9, "loud", True])
def test_loudness_outside_the_range_or_not_a_number_is_400(make_tenant: Any, value: Any) -> None:
    t = make_tenant()
    response = t.client.post("/api/v1/speech", {"text": "Hello.", "loudness": value})
    assert response.status_code == 400 and problem(response)["field"] == "loudness"
