"""/metrics: Prometheus text a parser reads, job and worker figures, and only for allowed addresses."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability.helpers import SHORT, make_org, submit, wait_status
from webapp.speech import heartbeat

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client: Client) -> dict[str, list[Any]]:
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        families.setdefault(family.name, []).extend(family.samples)
    return families


def value(families: dict[str, list[Any]], sample: str, **labels: str) -> float:
    return sum(
        s.value
        for samples in families.values()
        for s in samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_a_scrape_parses_and_counts_jobs_requests_and_workers(
    synth_worker: Any, builtin_voices: list[str]
) -> None:
    from webapp.metrics import rollup

    client = Client()
    scrape(client)  # the first scrape starts the job counters
    before = scrape(client)
    jobs = [submit(make_org("metrics"), f"Metrics {i}. {SHORT}") for i in range(3)]
    assert [r.status for r in wait_status([j.id for j in jobs])] == ["succeeded"] * 3
    for _ in range(3):
        client.get("/healthz")
    with override_settings():
        import webapp.metrics.rollup as module

        module.LAG = module.LAG * 0  # count the rows just written, not 10 s later
        try:
            after = scrape(client)
        finally:
            module.LAG = rollup.dt.timedelta(seconds=10)

    def grew(sample: str, **labels: str) -> float:
        return value(after, sample, **labels) - value(before, sample, **labels)

    assert grew("tts_jobs_submitted_total", engine="espeak") == 3
    assert grew("tts_jobs_finished_total", engine="espeak", status="succeeded") == 3
    assert grew("tts_characters_charged_total", plan="plan-metrics") == sum(j.text_chars for j in jobs)
    assert grew("tts_job_queue_wait_seconds_count", engine="espeak", device="cpu") == 3
    assert grew("tts_job_synthesis_seconds_bucket", engine="espeak", device="cpu", le="+Inf") == 3
    assert grew("tts_http_requests_total", view="healthz", method="GET", status="200") == 3
    assert value(after, "tts_http_request_duration_seconds_count", view="healthz", method="GET") >= 3
    assert value(after, "tts_jobs", status="succeeded") >= 3
    assert "tts_queue_depth" in after and value(after, "tts_queue_depth", queue="synth.espeak") >= 0
    beat = next(b for b in heartbeat.live_workers() if b.get("state") == "ready")
    ids = {"node": beat["node"], "pid": str(beat["pid"])}
    assert value(after, "tts_worker_child_rss_bytes", **ids) > 10 * 2**20
    assert value(after, "tts_worker_model_load_seconds", **ids) > 0
    assert value(after, "tts_worker_children", node=beat["node"], state="ready") >= 1


def test_it_answers_403_to_an_address_not_in_the_setting(db: None) -> None:
    client = Client()
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    # Behind Nginx the client's address comes in X-Real-IP, which Nginx sets itself.
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_REAL_IP="203.0.113.9").status_code == 403
    with override_settings(TTS_METRICS_ALLOWED_IPS=["203.0.113.0/24"]):
        assert client.get("/metrics", HTTP_X_REAL_IP="203.0.113.9").status_code == 200
