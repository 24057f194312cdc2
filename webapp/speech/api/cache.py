"""``DELETE /api/v1/cache``: the tenant empties its sentence cache (issue 33)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.speech.services import sentence_cache
from webapp.tenants.api.base import TenantAPIView


class SentenceCacheView(TenantAPIView):
    required_scopes = {"DELETE": "speech:write"}

    @extend_schema(
        request=None,
        responses={
            200: inline_serializer("SentenceCachePurged", {"bytes_freed": serializers.IntegerField()})
        },
        summary="Empty this tenant's sentence cache",
        description="Every sentence this tenant's jobs rendered and kept is removed; the next jobs "
        "render theirs afresh (and are billed fresh). Needs speech:write, as a submit does: the cache "
        "changes what jobs cost, never what anyone can read.",
    )
    def delete(self, request: Request) -> Response:
        return Response({"bytes_freed": sentence_cache.purge_tenant(self.organization.pk)})
