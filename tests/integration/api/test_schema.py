"""OpenAPI 3 schema (validated) and the browsable docs page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.conf import settings
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
        "/api/v1/cache",
        "/v1/audio/speech",
    } <= paths
    assert spec["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    job = spec["components"]["schemas"]["Job"]["properties"]
    assert {"queue_position", "eta_seconds", "metrics", "error", "audio_url"} <= set(job)


def test_docs_page_serves_redoc_from_our_static_files_without_external_assets(db: None) -> None:
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)  # hashed names, as in production
    response = Client().get("/api/docs")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert 'spec-url="/api/v1/schema"' in html  # the operations come from the schema tested above
    scripts = re.findall(r"<script[^>]*src=\"([^\"]+)\"", html)
    assert scripts and all(src.startswith("/static/drf_spectacular_sidecar/redoc/") for src in scripts)
    assert "http://" not in html and "https://" not in html  # no CDN, no web fonts
    assert not re.search(r"<script(?![^>]*src=)", html)  # no inline script (CSP script-src 'self')
    bundle = Client().get(scripts[0])
    assert bundle.status_code in (
        200,
        404,
    )  # Django serves static only with DEBUG; Nginx serves it in production
    assert (
        Path(settings.STATIC_ROOT) / scripts[0].removeprefix(settings.STATIC_URL)
    ).stat().st_size > 100_000


def test_the_schema_is_built_once_per_process_whatever_the_query(db: None) -> None:
    """A public page that walks every view: a stranger asking in a loop must not cost a build each time."""
    from unittest import mock

    from drf_spectacular.generators import SchemaGenerator

    first = Client().get("/api/v1/schema", {"format": "json"})
    assert first.status_code == 200
    # A spy on the real generator (it still builds): counts the builds after the first answer.
    with mock.patch.object(
        SchemaGenerator, "get_schema", autospec=True, side_effect=SchemaGenerator.get_schema
    ) as spy:
        answers = [
            Client().get("/api/v1/schema", query)
            for query in ({"format": "json"}, {}, {"version": "v9", "format": "json"}, {"lang": "de"})
        ]
    assert [a.status_code for a in answers] == [200] * 4
    assert spy.call_count == 0
    assert answers[0].json() == first.json() == answers[2].json()
