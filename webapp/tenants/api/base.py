"""The base of every tenant API view: key, role and scope, and the tenant's request rate."""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from webapp.errors import DomainError, ErrorCode
from webapp.tenants import ratelimit
from webapp.tenants.models import Organization
from webapp.tenants.permissions import RoleScopePermission

M = TypeVar("M", bound=Model)


class TenantAPIView(APIView):
    """Authenticated by API key, checked for role and scope, rate-limited per tenant (and key).

    Subclasses name the scope each method needs in ``required_scopes``; every
    answer carries the RateLimit headers of the limit that binds (the throttle
    leaves its usage on the request).
    """

    permission_classes = [permissions.IsAuthenticated, RoleScopePermission]
    # Counted in DRF's check_throttles, after authentication and permissions.
    throttle_classes = [ratelimit.TenantRateThrottle]
    required_scopes: dict[str, str] = {}

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        usage = getattr(request, "rate_usage", None)
        if usage is not None:
            for key, value in usage.headers().items():
                response[key] = value
        # A submit's concurrency in use and allowed (webapp.speech.submission.concurrency_headers).
        for key, value in getattr(request, "concurrency", {}).items():
            response[key] = value
        return super().finalize_response(request, response, *args, **kwargs)

    @property
    def organization(self) -> Organization:
        return self.request.user.organization  # type: ignore[union-attr]

    def tenant_object(self, queryset: QuerySet[M], raw_id: str, noun: str) -> M:
        """The tenant's object with this UUID: invalid_id for a malformed id, not_found outside the tenant."""
        pk = object_id(raw_id, noun)
        try:
            return queryset.get(pk=pk, organization=self.organization)  # no ORDER BY, unlike .first()
        except ObjectDoesNotExist:
            raise not_found(noun, pk) from None


def object_id(raw_id: str, noun: str) -> uuid.UUID:
    """The UUID in a URL, or invalid_id."""
    try:
        return uuid.UUID(raw_id)
    except ValueError:
        raise DomainError(
            ErrorCode.INVALID_ID, f"{raw_id[:60]!r} is not a {noun} id; {noun} ids are UUIDs.", field="id"
        ) from None


def not_found(noun: str, pk: uuid.UUID) -> DomainError:
    return DomainError(ErrorCode.NOT_FOUND, f"No {noun} {pk} in this organization.")
