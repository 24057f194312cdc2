"""What operators do to jobs and tenants from the admin console.

Each function is an action (``transaction.atomic(durable=True)`` here or in
the job service it calls): the admin calls them from views that Django's
admin does not wrap in a transaction of its own. Each records an audit event.

- :func:`retry_job`: a failed job runs again as a new job with a new
  reservation (the old one was released when it failed; the ledger allows one
  reserve and one charge per job, so the retry is a job of its own, naming
  the failed one in ``retry_of``).
- :func:`cancel_job` and :func:`expire_job_now`: the client's cancel and the
  retention expiry, on the operator's word.
- :func:`delete_tenant`: everything of a tenant goes, files included; the
  ledger keeps its totals per month and plan in ``RetiredUsage``, naming no one.
- :func:`recount_usage`: the tenant's usage per day and per key's month counted
  again from its ledger (``manage.py recount_usage``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import models, transaction
from django.db.models import Count, F, Sum

from webapp.audit import services as audit
from webapp.dictionaries import services as dictionary_services
from webapp.errors import DomainError, ErrorCode
from webapp.speech import lifecycle
from webapp.speech.models import IdempotencyKey, RetiredUsage, SynthesisJob, UsageEvent, UsagePeriod, Voice
from webapp.speech.services import files, ledger, prompts, sentence_cache
from webapp.speech.services.pins import dictionary_pins
from webapp.tenants import locks
from webapp.tenants.models import ApiKey, Membership, Organization

log = logging.getLogger(__name__)

Status = SynthesisJob.Status


# --------------------------------------------------------------------- jobs


def _retry_params(job: SynthesisJob, voice: Voice) -> dict[str, Any]:
    """The job's params as the client sent them: submit adds an approximate voice's pitch shift again."""
    shift = prompts.speaking_voice(voice)[2]
    if not shift or "pitch" not in job.params:
        return dict(job.params)
    return {**job.params, "pitch": round(float(job.params["pitch"]) - shift, 2)}


def retry_job(job: SynthesisJob) -> SynthesisJob:
    """Run a failed job again: a new job, checked against the plan and reserved like any submit."""
    job = SynthesisJob.objects.select_related("organization__plan", "voice").get(pk=job.pk)
    if job.status != Status.FAILED:
        raise DomainError(ErrorCode.JOB_FINISHED, f"Only failed jobs are retried; this one is {job.status}.")
    if job.retries.exists():
        raise DomainError(ErrorCode.INVALID_REQUEST, "This job was already retried.")
    if not job.text:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            "The job's text was removed after its plan's retention; it cannot run again.",
        )
    voice = job.voice
    if voice is None or voice.status != Voice.Status.READY:
        raise DomainError(ErrorCode.INVALID_REQUEST, "The job's voice is gone; it cannot run again.")
    request = lifecycle.JobRequest(
        text=job.text,
        voice=voice,
        format=job.format,
        sample_rate=job.sample_rate,
        params=_retry_params(job, voice),
        billable_chars=job.text_chars,
        source=job.source,
        # The versions the failed job pinned, those still there (a dictionary deleted since is gone).
        dictionaries=dictionary_pins(dictionary_services.pinned_versions(job.dictionaries or [])),
        synth_chars=job.synth_chars,
    )
    new_job, _ = lifecycle.submit_job(
        job.organization, request, api_key=job.api_key, user=job.user, retry_of=job
    )
    audit.record(
        "job.retried", target=job, organization=job.organization_id, details={"new_job": str(new_job.id)}
    )
    return new_job


def cancel_job(job: SynthesisJob) -> SynthesisJob:
    """Cancel a queued job now, or ask a running one to stop at its next sentence."""
    if job.status not in SynthesisJob.ACTIVE:
        raise DomainError(
            ErrorCode.JOB_FINISHED, f"Only queued or running jobs are canceled; this one is {job.status}."
        )
    result = lifecycle.cancel_job(job)
    audit.record("job.canceled", target=job, organization=job.organization_id, details={"was": job.status})
    return result


def expire_job_now(job: SynthesisJob) -> int:
    """Remove a succeeded job's audio now and mark it expired. Returns the bytes freed."""
    if job.status != Status.SUCCEEDED:
        raise DomainError(
            ErrorCode.JOB_FINISHED, f"Only succeeded jobs have audio to expire; this one is {job.status}."
        )
    freed = lifecycle.expire_audio(job.id, immediately=True)
    audit.record("job.expired", target=job, organization=job.organization_id, details={"bytes_freed": freed})
    return freed


# --------------------------------------------------------------------- tenants


def _retire_usage(org: Organization) -> None:
    """Add the tenant's monthly totals to the anonymous ones of its plan."""
    charged = dict(
        UsageEvent.objects.filter(organization=org, kind=UsageEvent.Kind.CHARGE)
        .values("period")
        .annotate(n=Count("id"))
        .values_list("period", "n")
    )
    used = UsagePeriod.objects.filter(organization=org).values("period").annotate(n=Sum("characters_used"))
    for row in used:
        retired, _ = RetiredUsage.objects.get_or_create(period=row["period"], plan=org.plan.slug)
        RetiredUsage.objects.filter(pk=retired.pk).update(
            tenants=F("tenants") + 1,
            characters_used=F("characters_used") + (row["n"] or 0),
            jobs=F("jobs") + charged.get(row["period"], 0),
        )


def _ids(queryset: models.QuerySet[Any]) -> list[str]:
    return [str(pk) for pk in queryset.values_list("pk", flat=True)]


def _forget_admin_history(objects: dict[type[models.Model], list[str]]) -> None:
    """The admin's own change history names objects by id and by name: it goes with them."""
    for model, ids in objects.items():
        if ids:
            content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
            LogEntry.objects.filter(content_type=content_type, object_id__in=ids).delete()


def _media_of(org: Organization) -> list[str]:
    """Every stored file of the tenant: its two folders, and any row's path outside them."""
    paths = [f"audio/{org.pk}", f"voices/{org.pk}"]
    paths += (
        SynthesisJob.objects.filter(organization=org)
        .exclude(audio_path="")
        .values_list("audio_path", flat=True)
    )
    for voice in Voice.objects.filter(organization=org):
        paths += [getattr(voice, f.name) for f in Voice._meta.fields if f.name.endswith("_path")]
    return [p for p in paths if p]


def _remove_media(paths: Iterable[str]) -> None:
    for relative in paths:
        try:
            path = files.media_path(relative)
        except files.UnsafePath as exc:
            log.error("tenant deletion: refusing to remove %s", exc)
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


# A deletion that keeps finding jobs submitted while it took its locks starts over this often.
DELETE_TENANT_TRIES = 5


class _JobsArrived(Exception):
    """A job was submitted between the job locks and the tenant lock: start over."""


def recount_usage(org: Organization) -> tuple[int, int]:
    """Count the tenant's usage per day and per key's month again from its ledger events.

    The rows are kept with each reservation and settlement; reservations made by a version
    that did not keep them (the upgrade that added them, while old workers still ran) or a
    restore of the events alone leave them short. Returns (day rows, key rows) written.
    """
    with transaction.atomic(durable=True):
        locks.lock_tenant(org.pk)
        written = ledger.recount_rollups(org.pk)
        audit.record(
            "usage.recounted",
            target=org,
            organization=org.pk,
            details={"day_rows": written[0], "key_rows": written[1]},
        )
    return written


def delete_tenant(org: Organization) -> dict[str, int]:
    """Delete a tenant and everything of it; return what went. Files go after the commit.

    Members lose their access: memberships and keys go, and members who
    belonged to no other tenant (and are not staff) are deleted with their
    accounts. A running attempt finds its job gone at its next write and
    removes its own file.
    """
    for _ in range(DELETE_TENANT_TRIES):
        try:
            return _delete_tenant(org)
        except _JobsArrived:
            continue
    raise DomainError(
        ErrorCode.SERVICE_UNAVAILABLE,
        f"Jobs kept arriving for {org.name} while it was being deleted; try again.",
        retry_after=5,
    )


def _lock_in_order(org_id: Any) -> Organization:
    """The tenant's rows locked in the one order every transaction takes (docs/decisions.md).

    Voices, then jobs, then the tenant row: a voice's deletion locks its voice,
    then its jobs, then (settling them) the tenant; a completion locks its job,
    then the tenant. A submit locks the tenant and then inserts a job, so a job
    may appear between our job locks and the tenant lock; locking it then would
    be the wrong order (its worker may hold it and wait for the tenant row), so
    the deletion starts over, with that job in its first pass. Once the tenant
    row is held no job can appear.
    """
    # NO KEY: a submit's deferred foreign-key check takes KEY SHARE on its voice at COMMIT.
    voices = Voice.objects.select_for_update(no_key=True).filter(organization_id=org_id)
    list(voices.order_by("pk").values_list("pk"))
    jobs = SynthesisJob.objects.filter(organization_id=org_id)
    locked = len(jobs.select_for_update().order_by("pk").values_list("pk"))
    org = locks.lock_tenant(org_id, locks.Mode.DELETE)
    if jobs.count() != locked:
        raise _JobsArrived
    return org


def _delete_tenant(org: Organization) -> dict[str, int]:
    User = get_user_model()
    with transaction.atomic(durable=True):
        org = _lock_in_order(org.pk)
        org_id = org.pk
        members = Membership.objects.filter(organization=org)
        only_here = (
            User.objects.filter(memberships__organization=org, is_staff=False, is_superuser=False)
            .annotate(tenants=Count("memberships"))
            .filter(tenants=1)
        )
        doomed: dict[type[models.Model], list[str]] = {
            Organization: [str(org_id)],
            ApiKey: _ids(ApiKey.objects.filter(organization=org)),
            Membership: _ids(members),
            SynthesisJob: _ids(SynthesisJob.objects.filter(organization=org)),
            Voice: _ids(Voice.objects.filter(organization=org)),
            User: _ids(only_here),
        }
        paths = _media_of(org)
        _retire_usage(org)
        counts = {model._meta.model_name or "": len(ids) for model, ids in doomed.items()}
        UsageEvent.objects.filter(organization=org).delete()
        UsagePeriod.objects.filter(organization=org).delete()
        IdempotencyKey.objects.filter(organization=org).delete()
        SynthesisJob.objects.filter(organization=org).delete()
        Voice.objects.filter(organization=org).delete()
        User.objects.filter(pk__in=doomed[User]).delete()
        org.delete()  # memberships and keys cascade
        _forget_admin_history(doomed)
        audit.anonymise_tenant(org_id)
        audit.record("tenant.deleted", target="(deleted tenant)", actor=None, details=counts)
        transaction.on_commit(lambda: _remove_media(paths))
        transaction.on_commit(lambda: sentence_cache.purge_tenant(org_id))
    return counts
