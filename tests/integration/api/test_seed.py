"""``seed``: a strict integer on both wires, refused for a model that does not take one.

The seed's effect (the same seed, the same audio) is tested on VoxCPM through a real worker
(tests/integration/voxcpm/test_voxcpm_seed.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import problem

BAD_SEEDS = [-1, 2**31, True, "42", 4.0, None]


@pytest.mark.parametrize("value", BAD_SEEDS)
def test_a_seed_that_is_not_an_integer_in_range_is_400_naming_the_field(make_tenant: Any, value: Any) -> None:
    t = make_tenant()
    native = t.client.post("/api/v1/speech", {"text": "Hello.", "seed": value})
    assert native.status_code == 400 and problem(native)["field"] == "seed", native.content
    if value is None:
        return  # on /v1/ a null seed is vLLM-Omni's "no seed" (test_vllm_omni_fields.py)
    body = {"model": "tts-1", "voice": "alloy", "input": "Hello.", "seed": value}
    openai = t.client.post("/v1/audio/speech", body)
    assert openai.status_code == 400, openai.content
    error = openai.json()["error"]
    assert error["param"] == "seed" and error["type"] == "invalid_request_error"


def test_a_seed_for_a_model_that_takes_none_is_400_unsupported_control(
    make_tenant: Any, builtin_voices: list[str]
) -> None:
    t = make_tenant()
    native = t.client.post("/api/v1/speech", {"text": "Hello.", "voice": "en_US-joe-medium", "seed": 7})
    assert native.status_code == 400, native.content
    assert problem(native)["code"] == "unsupported_control" and problem(native)["field"] == "seed"
    espeak = t.client.post("/api/v1/speech", {"text": "Hello.", "voice": "espeak-en-us", "seed": 7})
    assert espeak.status_code == 400 and problem(espeak)["field"] == "seed", espeak.content
    openai = t.client.post(
        "/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "Hi.", "seed": 7}
    )
    assert openai.status_code == 400, openai.content
    error = openai.json()["error"]
    assert error["code"] == "unsupported_control" and error["param"] == "seed"


def test_the_models_capabilities_say_whether_they_take_a_seed(
    make_tenant: Any, builtin_voices: list[str]
) -> None:
    t = make_tenant()
    models = {m["id"]: m for m in t.client.get("/v1/models").json()["data"]}
    assert models["piper"]["capabilities"]["seed"] is False
    assert models["espeak"]["capabilities"]["seed"] is False
