"""GET /healthz: database, Redis and a recent worker heartbeat. No internals shown."""

from __future__ import annotations

import logging

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from webapp.speech import heartbeat

log = logging.getLogger(__name__)


def _check_db() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception as exc:
        log.warning("healthz: database check failed: %s", exc)
        return False


def _check_redis() -> bool:
    try:
        return bool(heartbeat.client().ping())
    except Exception as exc:
        log.warning("healthz: redis check failed: %s", exc)
        return False


def _check_workers() -> bool:
    try:
        return any(w.get("state") == "ready" for w in heartbeat.live_workers())
    except Exception:
        return False


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"db": _check_db(), "redis": _check_redis()}
    checks["workers"] = checks["redis"] and _check_workers()
    failing = [name for name, ok in checks.items() if not ok]
    body: dict[str, object] = {
        "status": "ok" if not failing else "fail",
        "checks": {name: ("ok" if ok else "fail") for name, ok in checks.items()},
    }
    if failing:
        body["failing"] = failing
    response = JsonResponse(body, status=200 if not failing else 503)
    if failing:
        response["Retry-After"] = "10"
    return response
