"""Every operation of /api/v1/schema, fuzzed from the schema with a real key: no input gets a 5xx.

schemathesis generates valid and invalid requests (bodies, query parameters,
path parameters) for each operation and calls the Django app in process.
The only 5xx allowed is the OpenAI endpoint's 504 ``timeout`` for a request it
accepted: in this transaction-wrapped test a job is never dispatched, so it
cannot finish (the wait is set to zero).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")

EXAMPLES_PER_OPERATION = 25


@pytest.fixture
def api_schema(db: None) -> Iterator[Any]:
    from django.core import signals
    from django.db import close_old_connections

    from webapp.wsgi import application

    # As Django's test client does: the test's transaction must outlive each request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_key(make_tenant: Any, settings: Any) -> str:
    settings.TTS_OPENAI_WAIT_SECONDS = 0
    tenant = make_tenant(requests_per_minute=1_000_000, monthly_characters=10**9, max_concurrent_jobs=10**6)
    return str(tenant.raw_key)


def test_no_generated_request_gets_a_server_error(api_schema: Any, fuzz_key: str) -> None:
    tried = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        tried.append(f"{operation.method.upper()} {operation.path}")

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case: Any) -> None:
            response = case.call(headers={"Authorization": f"Bearer {fuzz_key}"})
            if response.status_code == 504 and case.path == "/v1/audio/speech":
                assert response.json()["error"]["code"] == "timeout"
                return
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])

        no_server_error()
    assert "POST /api/v1/speech" in tried and "POST /v1/audio/speech" in tried
