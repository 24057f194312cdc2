"""Queries written once (webapp/rawrows.py) read and write rows exactly as the ORM does."""

from __future__ import annotations

from typing import Any

import pytest


def _fields(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.mark.django_db
def test_an_insert_writes_the_row_the_orm_would(builtin_voices: list[str]) -> None:
    from django.utils import timezone

    from webapp import rawrows
    from webapp.speech.models import SynthesisJob, Voice
    from webapp.tenants.services import create_organization

    org = create_organization("rawrows")
    voice = Voice.objects.get(voice_id=builtin_voices[0])
    now = timezone.now()
    common: dict[str, Any] = {
        "organization": org,
        "voice": voice,
        "voice_name": voice.voice_id,
        "engine": voice.engine,
        "text": "Ünïcode and 'quotes'.",
        "text_chars": 21,
        "format": "wav",
        "params": {"speed": 1.5, "instructions": ["calm", {"nested": None}]},
        "created_at": now,
        "queued_at": now,
    }
    written = SynthesisJob(**common)
    rawrows.insert(written)
    assert not written._state.adding
    by_orm = SynthesisJob.objects.create(**common)
    ours, theirs = (_fields(SynthesisJob.objects.get(pk=j.pk)) for j in (written, by_orm))
    assert ours.pop("id") == written.id and theirs.pop("id") == by_orm.id
    assert ours == theirs
    assert ours["params"] == common["params"]  # JSON in and out, not a string


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
