from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from django.http import HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.test import Client

from tests.dashboard_data import make_owner


@pytest.fixture(scope="session", autouse=True)
def collected_static(django_db_setup: None) -> None:
    """The pages name hashed static files (the manifest storage Nginx serves): collect them once."""
    from django.conf import settings
    from django.core.management import call_command

    if not (Path(settings.STATIC_ROOT) / "staticfiles.json").exists():
        call_command("collectstatic", "--noinput", verbosity=0)


@pytest.fixture
def owner(db: None) -> tuple[Any, Any]:
    return make_owner(organization="Acme")


def redirect_url(response: HttpResponseBase) -> str:
    """A redirect's target: its ``.url``, which the test client's declared response type lacks."""
    return cast(HttpResponseRedirect, response).url


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client
