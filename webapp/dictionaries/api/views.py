"""``/api/v1/dictionaries``: a tenant's pronunciation dictionaries and their versions.

Reading needs ``speech:read``; creating, changing and deleting ``voices:write`` (the
tenant's speech assets: owners and admins). A body is JSON, or a W3C PLS 1.0 document
(``Content-Type: application/pls+xml``, read up to the plan's import bytes and no more);
a version answers as PLS to ``Accept: application/pls+xml``.
"""

from __future__ import annotations

from typing import Any, cast

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from synth import lexicon
from webapp.dictionaries import pls, services
from webapp.dictionaries.api.serializers import (
    DictionaryCreateSerializer,
    DictionarySerializer,
    DictionaryUpdateSerializer,
    NewDictionarySerializer,
    VersionCreateSerializer,
    VersionSerializer,
)
from webapp.dictionaries.models import Dictionary, DictionaryVersion
from webapp.errors import DomainError, ErrorCode
from webapp.tenants.api.base import TenantAPIView
from webapp.tenants.models import ApiKey

READ = ApiKey.Scope.SPEECH_READ.value
WRITE = ApiKey.Scope.VOICES_WRITE.value


class PlsParser(BaseParser):
    """The raw PLS document, read up to the plan's import limit (a longer one is a 413 before parsing)."""

    media_type = pls.MEDIA_TYPE

    # Any: DRF types a parser's answer as a mapping; request.data is these bytes.
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        view = parser_context["view"]
        organization = view.organization
        declared = parser_context["request"].META.get("CONTENT_LENGTH") or ""
        if declared.isascii() and declared.isdigit():
            services.check_import_size(organization, int(declared))
        limit = organization.plan.max_dictionary_import_bytes
        raw: bytes = stream.read(limit + 1) if stream is not None else b""
        services.check_import_size(organization, len(raw))
        return raw


class PlsRenderer(BaseRenderer):
    media_type = pls.MEDIA_TYPE
    format = "pls"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return data if isinstance(data, bytes) else b""


class DictionaryAPIView(TenantAPIView):
    parser_classes = [*cast(list[type[BaseParser]], api_settings.DEFAULT_PARSER_CLASSES), PlsParser]

    def get_dictionary(self, raw_id: str) -> Dictionary:
        return self.tenant_object(Dictionary.objects.all(), raw_id, "dictionary")

    def json_body(self, example: str) -> dict[str, Any]:
        if not isinstance(self.request.data, dict):
            raise DomainError(ErrorCode.INVALID_REQUEST, f"The body must be a JSON object, e.g. {example}.")
        data: dict[str, Any] = self.request.data
        rules = data.get("rules")
        limit = self.organization.plan.max_dictionary_rules
        if isinstance(rules, list) and len(rules) > limit:  # before each rule is validated
            raise DomainError(
                ErrorCode.DICTIONARY_LIMIT,
                f"{len(rules):,} rules; the plan allows {limit:,} per dictionary version.",
                field="rules",
                extra={"limit": "max_dictionary_rules", "max": limit},
            )
        return data

    def is_pls(self) -> bool:
        return (self.request.content_type or "").split(";")[0].strip() == pls.MEDIA_TYPE

    def pls_import(self) -> pls.Lexicon:
        data: Any = self.request.data  # PlsParser's bytes
        return services.parse_import(self.organization, data if isinstance(data, bytes) else b"")


def _rules(validated: list[dict[str, Any]]) -> list[lexicon.Rule]:
    return [services.rule_of(r, n) for n, r in enumerate(validated, 1)]


def _flag(raw: str | None, name: str) -> bool:
    if raw is None or raw in ("false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    raise DomainError(ErrorCode.INVALID_REQUEST, f"{name} must be true or false.", field=name)


class DictionaryListView(DictionaryAPIView):
    required_scopes = {"GET": READ, "POST": WRITE}

    @extend_schema(responses=DictionarySerializer(many=True), summary="This tenant's dictionaries")
    def get(self, request: Request) -> Response:
        rows = Dictionary.objects.filter(organization=self.organization).order_by("name")
        return Response({"results": DictionarySerializer(rows, many=True).data})

    @extend_schema(
        request={"application/json": DictionaryCreateSerializer, pls.MEDIA_TYPE: OpenApiTypes.BINARY},
        responses={201: NewDictionarySerializer},
        parameters=[
            OpenApiParameter("name", OpenApiTypes.STR, description="With a PLS body: the dictionary's name."),
            OpenApiParameter("description", OpenApiTypes.STR, description="With a PLS body."),
            OpenApiParameter("is_default", OpenApiTypes.BOOL, description="With a PLS body."),
        ],
        summary="Create a dictionary with its version 1 (JSON rules or a PLS 1.0 document)",
    )
    def post(self, request: Request) -> Response:
        if self.is_pls():
            parsed = self.pls_import()
            name = request.query_params.get("name") or ""
            if not name or len(name) > 100:
                raise DomainError(
                    ErrorCode.INVALID_REQUEST,
                    "A PLS import names the dictionary: ?name=... (1 to 100 characters).",
                    field="name",
                )
            dictionary, version = services.create_dictionary(
                self.organization,
                name,
                parsed.rules,
                description=(request.query_params.get("description") or "")[:500],
                language=parsed.language,
                is_default=_flag(request.query_params.get("is_default"), "is_default"),
            )
        else:
            serializer = DictionaryCreateSerializer(data=self.json_body('{"name": "brands", "rules": [...]}'))
            serializer.is_valid(raise_exception=True)
            data = serializer.validated_data
            dictionary, version = services.create_dictionary(
                self.organization,
                data["name"],
                _rules(data["rules"]),
                description=data.get("description", ""),
                language=data.get("language", ""),
                is_default=data.get("is_default", False),
            )
        location = reverse("api-dictionary-detail", args=[dictionary.pk])
        return Response(
            NewDictionarySerializer((dictionary, version)).data, status=201, headers={"Location": location}
        )


class DictionaryDetailView(DictionaryAPIView):
    required_scopes = {"GET": READ, "PATCH": WRITE, "DELETE": WRITE}

    @extend_schema(responses=DictionarySerializer, summary="One dictionary")
    def get(self, request: Request, dictionary_id: str) -> Response:
        return Response(DictionarySerializer(self.get_dictionary(dictionary_id)).data)

    @extend_schema(
        request=DictionaryUpdateSerializer,
        responses=DictionarySerializer,
        summary="Rename a dictionary or make it the tenant's default (rules change by a new version)",
    )
    def patch(self, request: Request, dictionary_id: str) -> Response:
        dictionary = self.get_dictionary(dictionary_id)
        serializer = DictionaryUpdateSerializer(data=self.json_body('{"is_default": true}'))
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        updated = services.update_dictionary(
            self.organization,
            dictionary,
            name=data.get("name"),
            description=data.get("description"),
            is_default=data.get("is_default"),
        )
        return Response(DictionarySerializer(updated).data)

    @extend_schema(
        responses={204: None},
        summary="Delete a dictionary and its versions (409 while queued or running jobs pin one)",
    )
    def delete(self, request: Request, dictionary_id: str) -> Response:
        services.delete_dictionary(self.organization, self.get_dictionary(dictionary_id))
        return Response(status=204)


class VersionListView(DictionaryAPIView):
    required_scopes = {"GET": READ, "POST": WRITE}

    @extend_schema(responses=VersionSerializer(many=True), summary="A dictionary's versions, newest first")
    def get(self, request: Request, dictionary_id: str) -> Response:
        versions = services.versions_of(self.get_dictionary(dictionary_id))
        return Response({"results": VersionSerializer(versions, many=True).data})

    @extend_schema(
        request={"application/json": VersionCreateSerializer, pls.MEDIA_TYPE: OpenApiTypes.BINARY},
        responses={201: VersionSerializer},
        summary="A new version of a dictionary (its rules in full: JSON or a PLS 1.0 document)",
    )
    def post(self, request: Request, dictionary_id: str) -> Response:
        dictionary = self.get_dictionary(dictionary_id)
        if self.is_pls():
            parsed = self.pls_import()
            rules, language = parsed.rules, parsed.language
        else:
            serializer = VersionCreateSerializer(data=self.json_body('{"rules": [...]}'))
            serializer.is_valid(raise_exception=True)
            rules = _rules(serializer.validated_data["rules"])
            language = serializer.validated_data.get("language", "")
        version = services.add_version(self.organization, dictionary, rules, language=language)
        location = reverse("api-dictionary-version", args=[dictionary.pk, version.number])
        data = VersionSerializer(version, context={"with_rules": True}).data
        return Response(data, status=201, headers={"Location": location})


class VersionDetailView(DictionaryAPIView):
    required_scopes = {"GET": READ}
    renderer_classes = [JSONRenderer, PlsRenderer]

    @extend_schema(
        responses={200: VersionSerializer, (200, pls.MEDIA_TYPE): OpenApiTypes.BINARY},
        summary="One version with its rules (as PLS 1.0 to Accept: application/pls+xml)",
    )
    def get(self, request: Request, dictionary_id: str, number: int) -> Response:
        dictionary = self.get_dictionary(dictionary_id)
        version = DictionaryVersion.objects.filter(dictionary=dictionary, number=number).first()
        if version is None:
            raise DomainError(ErrorCode.NOT_FOUND, f"Dictionary {dictionary.pk} has no version {number}.")
        if request.accepted_renderer.format == "pls":
            body = pls.export(services.synth_rules(version), version.language)
            filename = f"{dictionary.name}-v{version.number}.pls".replace('"', "")
            return Response(
                body,
                content_type=pls.MEDIA_TYPE,
                headers={"Content-Disposition": f'attachment; filename="{filename}"'},
            )
        return Response(VersionSerializer(version, context={"with_rules": True}).data)
