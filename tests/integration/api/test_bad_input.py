"""Bad input: each a clear 4xx problem, and nothing half-created."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.api.conftest import problem

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")


@pytest.fixture
def tenant(make_tenant: Any) -> Any:
    t = make_tenant(max_characters_per_request=500)
    yield t
    from webapp.speech.models import IdempotencyKey, SynthesisJob, UsageEvent

    # Whatever the bad request was, nothing of it may remain.
    assert not SynthesisJob.objects.filter(organization=t.org).exists()
    assert not UsageEvent.objects.filter(organization=t.org).exists()
    assert not IdempotencyKey.objects.filter(organization=t.org).exists()


def _post_raw(t: Any, raw: bytes, **headers: str) -> Any:
    return t.client.post("/api/v1/speech", raw=raw, **headers)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"text": "unterminated', "not valid JSON"),
        (b"", "required"),
        (b'{"text": "a", "speed": NaN}', "NaN"),
        (b'{"text": "a", "speed": Infinity}', "Infinity"),
        (b'{"text": "a", "speed": -Infinity}', "Infinity"),
        (b'{"text": "a", "speed": 1e999}', "out of range"),
        (b'{"text": "a", "sample_rate": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"text": "caf\xe9"}', "UTF-8"),
    ],
    ids=[
        "invalid-json",
        "empty-body",
        "nan",
        "infinity",
        "minus-infinity",
        "huge-float",
        "5000-digits",
        "invalid-utf8",
    ],
)
def test_unparseable_bodies_are_400(tenant: Any, raw: bytes, fragment: str) -> None:
    response = _post_raw(tenant, raw)
    assert response.status_code == 400
    assert fragment in problem(response)["detail"]


@pytest.mark.parametrize("body", [[{"text": "a"}], "text", 42, None])
def test_json_that_is_not_an_object_is_400(tenant: Any, body: Any) -> None:
    response = _post_raw(tenant, json.dumps(body).encode())
    assert response.status_code == 400
    assert "must be a JSON object" in problem(response)["detail"]


def test_body_over_size_limit_is_413(tenant: Any, settings: Any) -> None:
    raw = json.dumps({"text": "a" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)}).encode()
    response = _post_raw(tenant, raw)
    assert response.status_code == 413
    assert problem(response)["code"] == "request_too_large"


def test_text_over_plan_request_limit_is_413_naming_text(tenant: Any) -> None:
    response = tenant.client.post("/api/v1/speech", {"text": "word " * 200})
    assert response.status_code == 413
    body = problem(response)
    assert body["field"] == "text" and "1,000 characters" in body["detail"] and "500" in body["detail"]


@pytest.mark.parametrize(
    ("text", "position"),
    [("Hello\u0000world", 5), ("Bell\u0007", 4), ("esc \u001b[0m", 4), ("Lone \ud800 surrogate", 5)],
    ids=["nul", "bell", "escape", "lone-surrogate"],
)
def test_text_with_control_characters_or_surrogates_is_400_with_position(
    tenant: Any, text: str, position: int
) -> None:
    response = _post_raw(tenant, json.dumps({"text": text}).encode())
    assert response.status_code == 400
    body = problem(response)
    assert body["field"] == "text" and body["position"] == position


@pytest.mark.parametrize("text", ["", "   ", "\n\t \n"], ids=["empty", "spaces", "whitespace"])
def test_blank_text_is_400(tenant: Any, text: str) -> None:
    response = tenant.client.post("/api/v1/speech", {"text": text})
    assert response.status_code == 400
    assert problem(response)["field"] == "text"


def test_unclosed_annotation_is_400_with_position(tenant: Any) -> None:
    response = tenant.client.post("/api/v1/speech", {"text": "她[h][ào干净"})
    assert response.status_code == 400
    body = problem(response)
    assert body["field"] == "text" and body["code"] == "invalid_annotation" and body["position"] == 4


def test_missing_text_unknown_field_and_wrong_types_are_400(tenant: Any) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"voice": "en_US-joe-medium"}, "text"),
        ({"text": "Hi.", "colour": "blue"}, "colour"),
        ({"text": 123}, "text"),
        ({"text": "Hi.", "speed": "1.5"}, "speed"),
        ({"text": "Hi.", "speed": True}, "speed"),
        ({"text": "Hi.", "sample_rate": 22050.0}, "sample_rate"),
        ({"text": "Hi.", "sample_rate": "22050"}, "sample_rate"),
        ({"text": "Hi.", "voice": ["en_US-joe-medium"]}, "voice"),
        ({"text": "Hi.", "format": 3}, "format"),
        ({"text": "Hi.", "language": "not a language!"}, "language"),
    ]
    for body, field in cases:
        response = tenant.client.post("/api/v1/speech", body)
        assert response.status_code == 400, body
        assert problem(response)["field"] == field, (body, response.json())


@pytest.mark.parametrize(
    ("field", "value"),
    [("speed", 0.1), ("speed", 4.5), ("pitch", -13), ("pitch", 12.5), ("volume", -21), ("volume", 7)],
)
def test_out_of_range_controls_are_400(tenant: Any, field: str, value: float) -> None:
    response = tenant.client.post("/api/v1/speech", {"text": "Hi.", field: value})
    assert response.status_code == 400
    body = problem(response)
    assert body["field"] == field and body["code"] == "out_of_range"


def test_unknown_voice_is_400(tenant: Any) -> None:
    response = tenant.client.post("/api/v1/speech", {"text": "Hi.", "voice": "no-such-voice"})
    assert response.status_code == 400
    body = problem(response)
    assert body["field"] == "voice" and body["code"] == "unknown_voice" and "no-such-voice" in body["detail"]


def test_unsupported_format_and_rate_are_400(tenant: Any) -> None:
    from webapp.speech.models import Voice

    bad_format = tenant.client.post("/api/v1/speech", {"text": "Hi.", "format": "aiff"})
    assert bad_format.status_code == 400 and problem(bad_format)["field"] == "format"
    # Opus exists only at 8/12/16/24/48 kHz.
    bad_rate = tenant.client.post("/api/v1/speech", {"text": "Hi.", "format": "ogg", "sample_rate": 22050})
    assert bad_rate.status_code == 400
    body = problem(bad_rate)
    assert body["field"] == "sample_rate" and body["code"] == "unsupported_sample_rate"
    # A voice whose engine declares fewer formats refuses the others.
    Voice.objects.create(
        voice_id=f"wav-only-{tenant.org.slug}",
        organization=tenant.org,
        name="w",
        engine="piper",
        language="en_US",
        sample_rate=22050,
        capabilities={"formats": ["wav"], "controls": []},
    )
    limited = tenant.client.post(
        "/api/v1/speech", {"text": "Hi.", "voice": f"wav-only-{tenant.org.slug}", "format": "mp3"}
    )
    assert limited.status_code == 400 and problem(limited)["code"] == "unsupported_format"
    control = tenant.client.post(
        "/api/v1/speech", {"text": "Hi.", "voice": f"wav-only-{tenant.org.slug}", "speed": 1.2}
    )
    assert control.status_code == 400 and problem(control)["code"] == "unsupported_control"
    Voice.objects.filter(organization=tenant.org).delete()


def test_idempotency_key_over_255_characters_is_400(tenant: Any) -> None:
    response = tenant.client.post("/api/v1/speech", {"text": "Hi."}, HTTP_IDEMPOTENCY_KEY="k" * 256)
    assert response.status_code == 400
    assert problem(response)["field"] == "Idempotency-Key"


@pytest.mark.parametrize("job_id", ["not-a-uuid", "123", "00000000-0000-0000-0000-00000000000g"])
def test_job_id_that_is_not_a_uuid_is_400(tenant: Any, job_id: str) -> None:
    for path in (f"/api/v1/speech/{job_id}", f"/api/v1/speech/{job_id}/audio"):
        response = tenant.client.get(path)
        assert response.status_code == 400
        assert problem(response)["code"] == "invalid_id"


def test_unknown_paths_and_methods_are_problem_json(tenant: Any) -> None:
    missing = tenant.client.get("/api/v1/nothing-here")
    assert missing.status_code == 404 and problem(missing)["code"] == "not_found"
    wrong_method = tenant.client.client.put(
        "/api/v1/speech",
        b"{}",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}",
    )
    assert wrong_method.status_code == 405 and problem(wrong_method)["code"] == "method_not_allowed"


def test_html_and_sql_in_text_are_stored_verbatim(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = make_tenant()
    text = "<script>alert('x')</script> Robert'); DROP TABLE speech_synthesisjob;-- & done"
    response = t.client.post("/api/v1/speech", {"text": text})
    assert response.status_code == 202
    assert "<script>" not in response.content.decode()  # the job never echoes its text
    job = SynthesisJob.objects.get(id=response.json()["id"])
    assert job.text == text and SynthesisJob.objects.count() >= 1


def test_a_body_nested_a_hundred_thousand_levels_is_400_not_500(tenant: Any) -> None:
    deep = b'{"text": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = _post_raw(tenant, deep)
    assert response.status_code == 400
    assert "deeper than" in problem(response)["detail"]


@pytest.mark.parametrize("value", ["²", "١٢", "1e2", "-1", " 5", "99999999999999999999"])
def test_numeric_query_parameters_accept_only_ascii_digits(tenant: Any, value: str) -> None:
    listing = tenant.client.get("/api/v1/speech", {"limit": value})
    assert listing.status_code == 400 and problem(listing)["code"] == "invalid_limit"
    job_id = "00000000-0000-0000-0000-000000000000"
    waiting = tenant.client.get(f"/api/v1/speech/{job_id}", {"wait": value})
    assert waiting.status_code in (400, 404)  # the job lookup may answer first; never a 500
