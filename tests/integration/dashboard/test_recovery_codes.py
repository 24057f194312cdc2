"""Recovery codes are kept as digests only: no row of the database (nor so a backup) holds one in
clear, and the codes people held before (django-otp's static tokens, in clear) are digested by the
migration and still work, once."""

from __future__ import annotations

import importlib
from typing import Any

from django.apps import apps
from django.db import connection
from django.test import Client

from tests.dashboard_data import PASSWORD
from tests.integration.dashboard.conftest import client_for, redirect_url
from tests.redis_database import clear_cache

MIGRATION = "webapp.dashboard.migrations.0002_recovery_codes"


def _rows_holding(needle: str) -> list[str]:
    """The tables with a row whose text (every column) contains ``needle``."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT count(*) FROM "{table}" t WHERE t::text ILIKE %s', [f"%{needle}%"])
            if cursor.fetchone()[0]:
                found.append(table)
    return found


def _enrol(user: Any) -> list[str]:
    from django_otp.oath import totp
    from django_otp.plugins.otp_totp.models import TOTPDevice

    client = client_for(user)
    client.get("/app/account/security/")
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    page = client.post(
        "/app/account/security/", {"code": f"{totp(device.bin_key):06d}", "password": PASSWORD}
    )
    codes: list[str] = page.context["recovery_codes"]
    assert len(codes) == 10
    return codes


def _log_in_with(code: str) -> str | None:
    client = Client()
    client.post("/accounts/login/", {"username": "owner@example.com", "password": PASSWORD})
    answer = client.post("/accounts/login/code/", {"code": code})
    return redirect_url(answer) if answer.status_code == 302 else None


def test_no_row_holds_a_recovery_code_in_clear(owner: tuple[Any, Any]) -> None:
    clear_cache()
    codes = _enrol(owner[0])
    for code in codes:
        assert _rows_holding(code) == [], f"a recovery code is stored in clear: {code}"
    assert _log_in_with(codes[0].upper()) == "/app/synthesize/"  # typed in capitals: still the code
    assert _rows_holding(codes[1]) == []


def test_codes_held_from_before_are_digested_by_the_migration_and_work_once(owner: tuple[Any, Any]) -> None:
    from webapp.dashboard.models import RecoveryCodes, recovery_code_digest

    clear_cache()
    _enrol(owner[0])  # a TOTP device, so the log-in asks for a code; its new codes are not used here
    RecoveryCodes.objects.filter(user=owner[0]).delete()
    with connection.cursor() as cursor:  # django-otp's static tables as a database from before holds them
        cursor.execute(
            "CREATE TABLE otp_static_staticdevice (id serial PRIMARY KEY, user_id integer NOT NULL, "
            "name varchar(64) NOT NULL, confirmed boolean NOT NULL)"
        )
        cursor.execute(
            "CREATE TABLE otp_static_statictoken (id serial PRIMARY KEY, device_id integer NOT NULL, "
            "token varchar(16) NOT NULL)"
        )
        cursor.execute(
            "INSERT INTO otp_static_staticdevice (user_id, name, confirmed) VALUES (%s, 'Recovery codes', true)",
            [owner[0].pk],
        )
        cursor.execute(
            "INSERT INTO otp_static_statictoken (device_id, token) "
            "SELECT id, unnest(ARRAY['0a1b2c3d4e', '5f6a7b8c9d']) FROM otp_static_staticdevice"
        )
    migration = importlib.import_module(MIGRATION)
    with connection.schema_editor() as editor:
        migration.digest_legacy_codes(apps, editor)

    assert _rows_holding("0a1b2c3d4e") == [] and _rows_holding("5f6a7b8c9d") == []
    device = RecoveryCodes.objects.get(user=owner[0])
    assert device.codes.count() == 2
    # The migration digests as the model does.
    assert migration._digest("0a1b2c3d4e", device.salt, device.iterations) == recovery_code_digest(
        "0a1b2c3d4e", device.salt, device.iterations
    )
    assert _log_in_with("0a1b2c3d4e") == "/app/synthesize/"
    assert _log_in_with("0a1b2c3d4e") is None, "a recovery code worked twice"
