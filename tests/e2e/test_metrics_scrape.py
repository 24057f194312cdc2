"""/metrics through Nginx and the real gunicorn: counters of all worker processes add up in one scrape."""

from __future__ import annotations

import time
from typing import Any

import requests
import urllib3
from prometheus_client.parser import text_string_to_metric_families

from tests.stack import CFG

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
BASE = f"https://127.0.0.1:{CFG.https_port}"
N = 40


def healthz_count(session: requests.Session) -> float:
    response = session.get(f"{BASE}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "tts_http_requests_total" and sample.labels.get("view") == "healthz"
    )


def test_n_requests_give_n_in_one_scrape_across_gunicorn_workers(web: Any) -> None:
    session = requests.Session()
    session.verify = False
    session.trust_env = False
    before = healthz_count(session)
    for _ in range(N):
        # A new connection each time, so Nginx spreads them over gunicorn's workers;
        # paced under Nginx's general rate limit, so every one reaches Django.
        response = requests.get(f"{BASE}/healthz", verify=False, timeout=30, headers={"Connection": "close"})
        assert response.status_code in (200, 503), response.status_code
        time.sleep(0.06)
    assert healthz_count(session) - before == N
    # More than one process counted: without multiprocess mode one scrape would see only its own.
    counted_by = list(CFG.path("run", "prometheus").glob("counter_*.db"))
    assert len(counted_by) >= 2, counted_by
    # Nginx refuses addresses outside TTS_METRICS_ALLOWED_IPS before Django sees them.
    conf = CFG.path("nginx", "nginx.conf").read_text()
    assert "location = /metrics" in conf and "allow 127.0.0.1;" in conf and "deny all;" in conf
