from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.dashboard_data import make_owner


@pytest.fixture
def owner(db: None) -> tuple[Any, Any]:
    return make_owner(organization="Acme")


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client
