"""API key authentication: the key in any form agents send (webapp/credentials.py), one failure budget.

HTTP requests (``ApiKeyAuthentication``) and WebSocket handshakes (``authenticate_handshake``) find
their key through the same module and meet the same per-address budget of failures
(webapp/tenants/auth_failures.py): a socket is no way around it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from webapp.client_ip import client_ip
from webapp.credentials import (
    Credential,
    MalformedCredential,
    credential_from,
    credential_of_meta,
    protocol_to_echo,
)
from webapp.errors import DomainError, ErrorCode
from webapp.tenants import auth_failures
from webapp.tenants.models import ApiKey
from webapp.tenants.services import find_api_key, key_role, touch_api_key

# Re-exported: the session socket and the HTTP views read keys through this module alone.
__all__ = [
    "ApiKeyAuthentication",
    "ApiKeyUser",
    "Credential",
    "MalformedCredential",
    "authenticate_credential",
    "authenticate_handshake",
    "credential_from",
    "protocol_to_echo",
]


class ApiKeyUser:
    """The principal of an API request: the key, its tenant and the role it acts with (not a Django user)."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key
        self.organization = key.organization
        self.role = key_role(key)
        # The user the key acts for (None for a tenant key the operator issued).
        self.user_id: int | None = key.user_id

    @property
    def pk(self) -> str:
        return str(self.key.pk)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKeyUser, ApiKey] | None:
        malformed: MalformedCredential | None = None
        try:
            credential = credential_of_meta(request.META)
        except MalformedCredential as exc:
            credential, malformed = None, exc
        if credential is None and malformed is None:
            return None  # no credentials: the view's permissions answer (401 where a key is needed)
        try:
            key = authenticate_credential(credential, client_ip(request), malformed)
        except DomainError as error:
            if error.code == ErrorCode.UNAUTHENTICATED:
                # DRF's own 401, so WWW-Authenticate comes with it.
                raise exceptions.AuthenticationFailed(error.message) from None
            raise
        return ApiKeyUser(key), key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Tells drf-spectacular how API keys are sent (a Bearer token)."""

    target_class = "webapp.tenants.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "tts_<prefix>_<secret>"}


def authenticate_credential(
    credential: Credential | None, address: str | None, malformed: MalformedCredential | None = None
) -> ApiKey:
    """The key ``credential`` names, for a request from ``address``; DomainError otherwise.

    ``malformed``: what finding the credential raised (it costs a failure like a wrong key).
    """
    if credential is None and malformed is None:
        # No credentials cost nothing here: Nginx's anonymous zones limit those.
        raise DomainError(ErrorCode.UNAUTHENTICATED, "No API key; send 'Authorization: Bearer <api key>'.")
    if credential is not None and malformed is None:
        key = find_api_key(credential.token)
        if key is not None:
            # A valid key is never refused for what other credentials did from its address
            # (every tenant behind one NAT would be locked out by one stranger).
            touch_api_key(key, address)
            return key
    # Nginx lets credentials past its anonymous zones: an address whose credentials keep
    # failing gets a small budget of failures, then 429 (webapp/tenants/auth_failures.py).
    auth_failures.refuse_if_spent(address)
    auth_failures.record_failure(address)
    if malformed is not None:
        raise DomainError(ErrorCode.UNAUTHENTICATED, str(malformed))
    raise DomainError(ErrorCode.UNAUTHENTICATED, "Invalid, expired or revoked API key.")


def authenticate_handshake(
    headers: Mapping[str, str], query_string: str, subprotocols: Sequence[str], address: str | None
) -> tuple[ApiKey, Credential]:
    """A WebSocket handshake's key (every form, subprotocols included) and the credential it came in.

    ``headers``: lower-case names. DomainError (401 or 429) as for HTTP.
    """
    malformed: MalformedCredential | None = None
    try:
        credential = credential_from(headers, query_string, subprotocols)
    except MalformedCredential as exc:
        credential, malformed = None, exc
    key = authenticate_credential(credential, address, malformed)
    assert credential is not None  # authenticate_credential returns only for a credential that named a key
    return key, credential
