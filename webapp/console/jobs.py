"""The synthesis jobs' admin actions: Retry, Cancel and Expire now, through the services.

Django runs a changelist action outside any transaction of its own (only
form saves and the stock delete are wrapped), so the durable service
actions called here open the outermost transaction, as they must. Each job
is its own action: one refused job (not failed, already finished) is
reported and does not stop the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from webapp.errors import DomainError
from webapp.speech import operator
from webapp.speech.models import SynthesisJob


class DeviceFilter(admin.SimpleListFilter):
    """The device the job ran on, as its worker recorded it in the job's metrics."""

    title = "device"
    parameter_name = "device"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("cpu", "CPU"), ("cuda", "GPU (CUDA)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[SynthesisJob]) -> QuerySet[SynthesisJob]:
        value = self.value()
        return queryset.filter(metrics__device__startswith=value) if value else queryset


def _run_each(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[SynthesisJob],
    action: Callable[[SynthesisJob], Any],
    done: str,
) -> None:
    succeeded, refused = 0, []
    for job in queryset.order_by("created_at"):
        try:
            action(job)
            succeeded += 1
        except DomainError as exc:
            refused.append(f"{job.id}: {exc.message}")
    if succeeded:
        model_admin.message_user(request, f"{done}: {succeeded} job(s).", messages.SUCCESS)
    for line in refused[:20]:
        model_admin.message_user(request, line, messages.WARNING)


class JobActionsMixin:
    """Actions for staff who may change synthesis jobs; the job rows themselves stay read-only."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("speech.change_synthesisjob"))

    @admin.display(description="device")
    def device(self, job: SynthesisJob) -> str:
        return str((job.metrics or {}).get("device", ""))

    @admin.action(
        description="Retry the selected failed jobs (a new job, a new reservation)", permissions=["operate"]
    )
    def retry(self, request: HttpRequest, queryset: QuerySet[SynthesisJob]) -> None:
        _run_each(self, request, queryset, operator.retry_job, "Re-queued")  # type: ignore[arg-type]

    @admin.action(description="Cancel the selected queued or running jobs", permissions=["operate"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[SynthesisJob]) -> None:
        _run_each(self, request, queryset, operator.cancel_job, "Canceled")  # type: ignore[arg-type]

    @admin.action(description="Expire the selected jobs' audio now", permissions=["operate"])
    def expire_now(self, request: HttpRequest, queryset: QuerySet[SynthesisJob]) -> None:
        _run_each(self, request, queryset, operator.expire_job_now, "Expired")  # type: ignore[arg-type]
