"""A tenant's data as one JSON document: what ``GET /api/v1/organization/export`` and ``manage.py
export_tenant`` hand out (docs/api.md, "Exporting a tenant's data").

What it holds: the organization and its plan, members (never a password hash), API keys (never a
secret or its hash), voices (never a speaker embedding or a file path), voice consents with their
whole audit record (phrase, code, what was heard, the recording's checksum, who recorded it and
when, who revoked it and when, revoked ones included), pronunciation dictionaries with their rules,
and the job history's metadata (never the text or the audio). Biometric data (embeddings,
recordings, prompts) stays out: it is the tenant's to delete, not to copy around.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.api_fields import iso
from webapp.audit import services as audit
from webapp.dictionaries.models import Dictionary, Rule
from webapp.speech.models import SynthesisJob, Voice, VoiceConsent
from webapp.tenants.models import ApiKey, Membership, Organization

FORMAT_VERSION = 1
JOB_BATCH = 2000  # job rows read per round trip (a tenant's history may hold millions)


def export_tenant(organization: Organization, actor: Any) -> dict[str, Any]:
    """The tenant's data, read in one transaction, and the export recorded in the audit log.

    ``actor``: who asked (a user, an API key, or ``OPERATOR`` for the command).
    """
    with transaction.atomic(durable=True):
        org = Organization.objects.select_related("plan").get(pk=organization.pk)
        document: dict[str, Any] = {
            "object": "organization.export",
            "format_version": FORMAT_VERSION,
            "exported_at": iso(timezone.now()),
            "organization": _organization(org),
            "members": list(_members(org)),
            "api_keys": list(_api_keys(org)),
            "voices": list(_voices(org)),
            "voice_consents": list(_consents(org)),
            "dictionaries": list(_dictionaries(org)),
            "jobs": list(_jobs(org)),
        }
        audit.record(
            "organization.exported",
            target=org,
            organization=org,
            actor=actor,
            details={name: len(document[name]) for name in ("voices", "voice_consents", "jobs")},
        )
    return document


def _organization(org: Organization) -> dict[str, Any]:
    return {
        "id": str(org.pk),
        "name": org.name,
        "slug": org.slug,
        "is_active": org.is_active,
        "created_at": iso(org.created_at),
        "plan": {"slug": org.plan.slug, "name": org.plan.name},
    }


def _members(org: Organization) -> Iterator[dict[str, Any]]:
    rows = Membership.objects.filter(organization=org).select_related("user").order_by("created_at", "pk")
    for m in rows:
        yield {
            "user_id": m.user_id,
            "username": m.user.get_username(),
            "email": getattr(m.user, "email", ""),
            "role": m.role,
            "joined_at": iso(m.created_at),
            "last_login": iso(m.user.last_login),
        }


def _api_keys(org: Organization) -> Iterator[dict[str, Any]]:
    for key in ApiKey.objects.filter(organization=org).order_by("created_at", "pk"):
        yield {
            "id": str(key.pk),
            "name": key.name,
            "prefix": f"tts_{key.prefix}_",
            "scopes": list(key.scopes or []),
            "user_id": key.user_id,
            "created_by_id": key.created_by_id,
            "parent_id": str(key.parent_id) if key.parent_id else None,
            "requests_per_minute": key.requests_per_minute,
            "monthly_characters": key.monthly_characters,
            "created_at": iso(key.created_at),
            "last_used_at": iso(key.last_used_at),
            "expires_at": iso(key.expires_at),
            "rotated_at": iso(key.rotated_at),
            "revoked_at": iso(key.revoked_at),
        }


def _voices(org: Organization) -> Iterator[dict[str, Any]]:
    rows = Voice.objects.filter(organization=org).select_related("consent").order_by("created_at", "pk")
    for v in rows:
        yield {
            "id": v.voice_id,
            "name": v.name,
            "status": v.status,
            "status_reason": v.status_reason,
            "rejected_code": v.rejected_code,
            "cloning_mode": v.cloning_mode,
            "consent": v.consent.consent_id if v.consent else None,
            "consent_by": v.consent_by_label,
            "consent_at": iso(v.consent_at),
            "transcript": v.transcript,
            "language": v.language,
            "closest_voice": v.closest_voice,
            "pitch_shift": v.pitch_shift,
            "created_at": iso(v.created_at),
            "last_used_at": iso(v.last_used_at),
        }


def _consents(org: Organization) -> Iterator[dict[str, Any]]:
    """Each consent's audit record, revoked ones and those whose recording went with their voices."""
    rows = VoiceConsent.objects.filter(organization=org).order_by("created_at", "pk")
    voices: dict[Any, list[str]] = {}
    for consent_pk, voice_id in Voice.objects.filter(organization=org, consent__isnull=False).values_list(
        "consent_id", "voice_id"
    ):
        voices.setdefault(consent_pk, []).append(voice_id)
    for c in rows:
        yield {
            "id": c.consent_id,
            "name": c.name,
            "language": c.language,
            "status": c.status,
            "checked_by": c.checked_by,
            "phrase": c.phrase_text,
            "code": c.code,
            "heard_code": c.heard_code,
            "recording_sha256": c.recording_sha256,
            "recording_bytes": c.recording_bytes,
            "recording_seconds": c.recording_seconds,
            "recording_kept": bool(c.recording_path),
            "created_by": c.created_by_label,
            "created_by_id": c.created_by_id,
            "created_at": iso(c.created_at),
            "revoked_at": iso(c.revoked_at),
            "revoked_by": c.revoked_by_label,
            "voices": sorted(voices.get(c.pk, [])),
        }


def _dictionaries(org: Organization) -> Iterator[dict[str, Any]]:
    for d in Dictionary.objects.filter(organization=org).order_by("name"):
        versions = []
        for version in d.versions.order_by("number"):
            rules = Rule.objects.filter(version=version).order_by("position")
            versions.append(
                {
                    "number": version.number,
                    "language": version.language,
                    "created_at": iso(version.created_at),
                    "rules": [
                        {
                            "grapheme": r.grapheme,
                            "case_sensitive": r.case_sensitive,
                            "alias": r.alias,
                            "phonemes": r.phonemes,
                            "alphabet": r.alphabet,
                        }
                        for r in rules
                    ],
                }
            )
        yield {
            "id": str(d.pk),
            "name": d.name,
            "description": d.description,
            "is_default": d.is_default,
            "latest_version": d.latest_version,
            "created_at": iso(d.created_at),
            "versions": versions,
        }


JOB_FIELDS = (
    "id",
    "status",
    "voice_name",
    "engine",
    "cloning_mode",
    "source",
    "format",
    "sample_rate",
    "text_chars",
    "cached_characters",
    "duration_seconds",
    "error_code",
    "api_key__prefix",
    "user_id",
    "created_at",
    "started_at",
    "finished_at",
)


def _jobs(org: Organization) -> Iterator[dict[str, Any]]:
    """The job history's metadata, oldest first: never the text, the audio or the request's params."""
    rows = SynthesisJob.objects.filter(organization=org).order_by("created_at", "pk").values(*JOB_FIELDS)
    for row in rows.iterator(chunk_size=JOB_BATCH):
        prefix = row.pop("api_key__prefix")
        voice = row.pop("voice_name")
        yield {
            **row,
            "id": str(row["id"]),
            "voice": voice,
            "api_key": f"tts_{prefix}_" if prefix else None,
            "created_at": iso(row["created_at"]),
            "started_at": iso(row["started_at"]),
            "finished_at": iso(row["finished_at"]),
        }
