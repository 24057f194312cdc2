"""Helpers for the admin console tests: a staff client, committed rows, waiting on jobs."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.integration.api.conftest import live_tenant, make_tenant  # noqa: F401 (fixtures)

STAFF_IP = "203.0.113.7"


@pytest.fixture(scope="module", autouse=True)
def _static_manifest(django_db_setup: None) -> None:
    """The admin pages name hashed static files, as in production: that needs the manifest."""
    from django.core.management import call_command

    call_command("collectstatic", "--noinput", verbosity=0)


def staff_client(username: str = "operator") -> tuple[Client, Any]:
    """A signed-in superuser whose requests come from STAFF_IP, as Nginx's X-Real-IP says."""
    from django.contrib.auth.models import User

    user = User.objects.create_superuser(username, f"{username}@example.test", "pw-operator-123")
    client = Client(HTTP_X_REAL_IP=STAFF_IP)
    client.force_login(user)
    return client, user


def run_action(client: Client, model: str, action: str, ids: list[Any], **extra: str) -> Any:
    """POST a changelist action, as the admin's action form does."""
    return client.post(
        f"/admin/{model}/",
        {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra},
    )


def job_status(job_id: Any) -> str:
    from webapp.speech.models import SynthesisJob

    return str(SynthesisJob.objects.filter(id=job_id).values_list("status", flat=True).get())
