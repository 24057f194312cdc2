"""OpenAPI 3 schema (validated) and the browsable docs page."""

from __future__ import annotations

from typing import Any

from django.test import Client
from openapi_spec_validator import validate


def test_schema_is_valid_openapi_3_and_lists_every_endpoint(db: None) -> None:
    response = Client().get("/api/v1/schema", {"format": "json"})
    assert response.status_code == 200
    spec: dict[str, Any] = response.json()
    validate(spec)
    assert spec["openapi"].startswith("3.")
    paths = set(spec["paths"])
    assert {
        "/api/v1/voices",
        "/api/v1/voices/{voice_id}",
        "/api/v1/speech",
        "/api/v1/speech/{job_id}",
        "/api/v1/speech/{job_id}/audio",
        "/api/v1/speech/{job_id}/cancel",
        "/api/v1/usage",
        "/v1/audio/speech",
    } <= paths
    assert spec["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    job = spec["components"]["schemas"]["Job"]["properties"]
    assert {"queue_position", "eta_seconds", "metrics", "error", "audio_url"} <= set(job)


def test_docs_page_renders_operations_without_external_assets(db: None) -> None:
    response = Client().get("/api/docs")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "/api/v1/speech/{job_id}/audio" in html and "POST" in html
    assert "http://" not in html and "https://cdn" not in html and "<script" not in html
