"""Every HTTP request counted by view, method and status, with its latency."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "tts_http_requests",
    "HTTP requests answered, by view, method and status.",
    ["view", "method", "status"],
)
LATENCY = Histogram(
    "tts_http_request_duration_seconds",
    "Time to answer an HTTP request, by view and method.",
    ["view", "method"],
    # Long polls and /v1/audio/speech wait up to minutes.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
# A method outside these is counted as "other": a client must not create label values at will.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def view_label(request: HttpRequest) -> str:
    """The URL pattern's name (bounded), never the path (unbounded: ids, probes)."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unresolved"
    return str(match.view_name or match.url_name or "unnamed")


def record(view: str, method: str, status: int, started: float) -> None:
    """Count one answered request; ``started`` is its ``time.perf_counter()`` at arrival."""
    method = method if method in METHODS else "other"
    REQUESTS.labels(view, method, str(status)).inc()
    LATENCY.labels(view, method).observe(time.perf_counter() - started)


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        record(view_label(request), request.method or "", response.status_code, started)
        return response
