"""One request id from the request to the job row, the Celery message and the worker's log lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tests.integration.api.conftest import wait_finished
from tests.reliability.helpers import wait_until


def test_the_request_id_reaches_the_job_and_the_workers_log(live_tenant: Any, stack: Any) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    request_id = "edge-0123456789abcdef"
    response = tenant.client.post(
        "/api/v1/speech", {"text": "Follow me to the worker."}, HTTP_X_REQUEST_ID=request_id
    )
    assert response.status_code == 202
    assert response["X-Request-Id"] == request_id
    job_id = response.json()["id"]
    assert wait_finished(tenant.client, job_id)["status"] == "succeeded"
    assert SynthesisJob.objects.get(id=job_id).request_id == request_id
    log_file = Path(stack.cfg.log_dir, "worker.log")
    line = wait_until(
        lambda: next(
            (x for x in log_file.read_text().splitlines() if f"job {job_id}: attempt 1 claimed" in x), None
        ),
        timeout=10,
        what="the worker's claim line",
    )
    assert f" {request_id} " in line


def test_a_request_without_an_id_gets_one_and_a_bad_one_is_replaced(client: Any, db: None) -> None:
    fresh = client.get("/healthz")
    assert len(fresh["X-Request-Id"]) == 32
    forged = client.get("/healthz", HTTP_X_REQUEST_ID="bad id\nwith a newline")
    assert forged["X-Request-Id"] != "bad id\nwith a newline" and len(forged["X-Request-Id"]) == 32


def test_json_log_lines_carry_the_request_and_job(db: None) -> None:
    from webapp.audit import context
    from webapp.audit.logformat import JsonFormatter, RequestIdFilter

    record = logging.LogRecord("webapp.speech", logging.INFO, __file__, 1, "job %s done", ("j1",), None)
    token = context.bind("req-42", job_id="j1")
    try:
        RequestIdFilter().filter(record)
    finally:
        context.unbind(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job j1 done" and line["request_id"] == "req-42" and line["job_id"] == "j1"
    assert line["level"] == "INFO" and line["logger"] == "webapp.speech"
