"""Read models for the views and the admin: what a tenant sees of its voices and jobs (its usage: the ledger's ``usage``)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from webapp.rawrows import columns, fetch_one
from webapp.speech.models import SynthesisJob, Voice
from webapp.tenants.models import Organization

Status = SynthesisJob.Status


def visible_voices(organization: Organization) -> Any:
    """Voices a tenant may use: the built-in ones and its own, ready ones only."""
    return Voice.objects.filter(
        Q(organization__isnull=True) | Q(organization=organization), status=Voice.Status.READY, one_off=False
    )


def voice_id_named(organization: Organization, value: str) -> str:
    """``value`` as a voice id: itself when a voice has that id, else the id of the tenant's one
    live voice of that name (vLLM-Omni names uploaded voices by name), else itself (unknown)."""
    if Voice.objects.filter(voice_id=value).exists():
        return value
    named = list(
        Voice.objects.filter(
            organization=organization,
            name__iexact=value,
            status__in=[Voice.Status.READY, Voice.Status.PROCESSING],
            one_off=False,
        ).values_list("voice_id", flat=True)[:2]
    )
    return named[0] if len(named) == 1 else value


def job_row(job_id: Any, organization_id: Any = None) -> SynthesisJob | None:
    """The job with this id (of this tenant, if given), or None.

    Every job GET, long-poll answer and download reads it, some more than once:
    written once (webapp/rawrows.py), it costs about 1 ms of CPU less per read
    than ``SynthesisJob.objects.get`` (tests/bench/bench_queries.py).
    """
    j = columns(SynthesisJob, "j")
    if organization_id is None:
        row = fetch_one(f"SELECT {j.sql} FROM {j.table} WHERE j.id = %s", [job_id])
    else:
        row = fetch_one(
            f"SELECT {j.sql} FROM {j.table} WHERE j.id = %s AND j.organization_id = %s",
            [job_id, organization_id],
        )
    return None if row is None else j.build(row)


def visible_voice(organization: Organization, voice_id: str) -> Voice | None:
    """The voice ``voice_id`` if the tenant may use it (``visible_voices``' rule), else None.

    Voice ids are unique across tenants and built-ins, so the row is read by its
    id alone and the tenant's part of the rule checked on it. Every submit runs
    this: written once (webapp/rawrows.py), it costs 1.3 ms of CPU less than
    ``visible_voices(...).get`` (tests/bench/bench_queries.py); both forms select
    the same voices (tests/integration/api/test_read_rules.py).
    """
    v = columns(Voice, "v")
    row = fetch_one(
        f"SELECT {v.sql} FROM {v.table} WHERE v.voice_id = %s AND v.status = %s",
        [voice_id, Voice.Status.READY.value],
    )
    voice: Voice | None = None if row is None else v.build(row)
    return voice if voice is not None and voice.organization_id in (None, organization.pk) else None
