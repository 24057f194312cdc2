"""``GET /api/v1/organization/export``: the tenant's data as one JSON document (owners and admins)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.speech.api.views import TenantAPIView
from webapp.speech.services import tenant_export


class OrganizationExportView(TenantAPIView):
    # keys:manage: the tenant's configuration and its members, as keys and webhooks; only owners and
    # admins (and a tenant-wide key, which acts as an admin) may use it.
    required_scopes = {"GET": "keys:manage"}

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        summary="The tenant's data: organization, members, keys, voices, consents, dictionaries, jobs",
    )
    def get(self, request: Request) -> Response:
        document = tenant_export.export_tenant(self.organization, request.auth)
        slug = document["organization"]["slug"]
        return Response(
            document,
            headers={
                "Cache-Control": "no-store",
                "Content-Disposition": f'attachment; filename="{slug}-export.json"',
            },
        )
