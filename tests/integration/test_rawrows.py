"""Queries written once (webapp/rawrows.py) read rows exactly as the ORM does."""

from __future__ import annotations

from typing import Any

import pytest


def _fields(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.mark.django_db
def test_columns_build_the_instance_the_orm_reads(builtin_voices: list[str]) -> None:
    from webapp.rawrows import columns, fetch_one
    from webapp.speech.models import Voice

    v = columns(Voice, "v")
    for voice in Voice.objects.all():
        row = fetch_one(f"SELECT {v.sql} FROM {v.table} WHERE v.id = %s", [voice.pk])
        assert row is not None
        built = v.build(row)
        assert _fields(built) == _fields(voice), voice.voice_id
        assert isinstance(built.capabilities, dict)  # JSON converted as the ORM converts it
