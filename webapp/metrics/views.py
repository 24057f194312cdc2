"""GET /metrics: only for the addresses in TTS_METRICS_ALLOWED_IPS (Nginx checks the same list first)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from webapp.audit.context import client_ip
from webapp.metrics.collector import ServiceCollector
from webapp.metrics.multiproc import ENV


def allowed(ip: str | None) -> bool:
    if ip is None:
        return False
    address = ipaddress.ip_address(ip)
    for item in settings.TTS_METRICS_ALLOWED_IPS:
        try:
            if address in ipaddress.ip_network(item, strict=False):
                return True
        except ValueError:
            continue
    return False


class _ThisProcess(Collector):
    """Without multiprocess mode (runserver, tests): the process's own metrics."""

    def collect(self) -> Iterator[Any]:
        yield from REGISTRY.collect()


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(reg)
    else:
        reg.register(_ThisProcess())
    reg.register(ServiceCollector())
    return reg


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(client_ip(request)):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
