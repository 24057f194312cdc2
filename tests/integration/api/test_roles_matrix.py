"""Role x scope x endpoint: every operation of the API checks both, against the real API.

Each key carries exactly one scope and acts for a user of one role (the role
is set after the key is issued, as after a demotion, so a key may carry a
scope its role does not allow). A call passes when the key has the scope the
operation needs and the role allows it; otherwise it is a 403.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from tests.integration.api.conftest import ApiClient
from tests.integration.api.people import key_for, member

pytestmark = pytest.mark.usefixtures("builtin_voices")

READ, WRITE, VOICES, KEYS = "speech:read", "speech:write", "voices:write", "keys:manage"
# The scope each operation needs: kept by hand, so weakening one fails here.
REQUIRED = {
    ("GET", "/api/v1/voices"): READ,
    ("POST", "/api/v1/voices"): VOICES,
    ("GET", "/api/v1/voices/{voice_id}"): READ,
    ("DELETE", "/api/v1/voices/{voice_id}"): VOICES,
    ("POST", "/api/v1/voices/{voice_id}/consent"): VOICES,
    ("GET", "/api/v1/voice_consents"): READ,
    ("POST", "/api/v1/voice_consents"): VOICES,
    ("GET", "/api/v1/voice_consents/phrase"): VOICES,
    ("GET", "/api/v1/voice_consents/{consent_id}"): READ,
    ("DELETE", "/api/v1/voice_consents/{consent_id}"): VOICES,
    ("GET", "/v1/audio/voice_consents"): READ,
    ("POST", "/v1/audio/voice_consents"): VOICES,
    ("GET", "/v1/audio/voice_consents/phrase"): VOICES,
    ("GET", "/v1/audio/voice_consents/{consent_id}"): READ,
    ("DELETE", "/v1/audio/voice_consents/{consent_id}"): VOICES,
    ("GET", "/api/v1/speech"): READ,
    ("POST", "/api/v1/speech"): WRITE,
    ("GET", "/api/v1/speech/{job_id}"): READ,
    ("DELETE", "/api/v1/speech/{job_id}"): WRITE,
    ("GET", "/api/v1/speech/{job_id}/audio"): READ,
    ("POST", "/api/v1/speech/{job_id}/cancel"): WRITE,
    ("GET", "/api/v1/usage"): READ,
    ("DELETE", "/api/v1/cache"): WRITE,
    ("GET", "/api/v1/speech/{job_id}/stream"): READ,
    ("GET", "/api/v1/speech/{job_id}/timestamps"): READ,
    ("GET", "/api/v1/sessions"): READ,
    ("GET", "/api/v1/sessions/{session_id}"): READ,
    ("POST", "/v1/audio/speech"): WRITE,
    ("POST", "/v1/audio/speech/batch"): WRITE,
    ("GET", "/v1/models"): READ,
    ("GET", "/v1/audio/voices"): READ,
    ("POST", "/v1/audio/voices"): VOICES,
    ("DELETE", "/v1/audio/voices/{name}"): VOICES,
    ("GET", "/api/v1/keys"): KEYS,
    ("POST", "/api/v1/keys"): KEYS,
    ("DELETE", "/api/v1/keys/{key_id}"): KEYS,
    ("POST", "/api/v1/keys/{key_id}/rotate"): KEYS,
    ("GET", "/api/v1/dictionaries"): READ,
    ("POST", "/api/v1/dictionaries"): VOICES,
    ("GET", "/api/v1/dictionaries/{dictionary_id}"): READ,
    ("PATCH", "/api/v1/dictionaries/{dictionary_id}"): VOICES,
    ("DELETE", "/api/v1/dictionaries/{dictionary_id}"): VOICES,
    ("GET", "/api/v1/dictionaries/{dictionary_id}/versions"): READ,
    ("POST", "/api/v1/dictionaries/{dictionary_id}/versions"): VOICES,
    ("GET", "/api/v1/dictionaries/{dictionary_id}/versions/{number}"): READ,
    # Webhooks configure the tenant, as keys do: keys:manage for reading them too (their log
    # holds what was sent).
    ("GET", "/api/v1/webhooks"): KEYS,
    ("POST", "/api/v1/webhooks"): KEYS,
    ("GET", "/api/v1/webhooks/{endpoint_id}"): KEYS,
    ("PATCH", "/api/v1/webhooks/{endpoint_id}"): KEYS,
    ("DELETE", "/api/v1/webhooks/{endpoint_id}"): KEYS,
    ("POST", "/api/v1/webhooks/{endpoint_id}/rotate-secret"): KEYS,
    ("POST", "/api/v1/webhooks/{endpoint_id}/ping"): KEYS,
    ("GET", "/api/v1/webhooks/{endpoint_id}/deliveries"): KEYS,
    ("GET", "/api/v1/webhooks/deliveries"): KEYS,
    ("POST", "/api/v1/webhooks/deliveries/{delivery_id}/redeliver"): KEYS,
    ("POST", "/api/v1/webhooks/job-secret"): KEYS,
    # The tenant's data (members, keys, consents' audit records): owners and admins, as keys.
    ("GET", "/api/v1/organization/export"): KEYS,
}
# What each role may use; "tenant" is a key the operator issued to the tenant as a whole.
ROLE_MAY = {
    "owner": {READ, WRITE, VOICES, KEYS},
    "admin": {READ, WRITE, VOICES, KEYS},
    "member": {READ, WRITE},
    "viewer": {READ},
    "tenant": {READ, WRITE, VOICES, KEYS},
}
# Operations that need no key at all.
PUBLIC = {("GET", "/api/v1/schema")}


def _operations() -> set[tuple[str, str]]:
    spec = Client().get("/api/v1/schema", {"format": "json"}).json()
    methods = {"get", "post", "put", "patch", "delete"}
    return {(m.upper(), path) for path, item in spec["paths"].items() for m in item if m in methods}


def _call(client: ApiClient, method: str, template: str) -> Any:
    # Ids that exist nowhere: a call that passes the checks answers 404, or 400 for an empty
    # body (415 where the endpoint takes an upload, not JSON).
    template = template.replace("{dictionary_id}", str(uuid.uuid4())).replace("{number}", "1")
    template = template.replace("{consent_id}", f"cons_{uuid.uuid4().hex}")
    template = template.replace("{session_id}", str(uuid.uuid4()))
    template = template.replace("{endpoint_id}", str(uuid.uuid4())).replace(
        "{delivery_id}", str(uuid.uuid4())
    )
    path = template.format(
        voice_id="no-such-voice",
        name="no-such-voice",
        job_id=uuid.uuid4(),
        key_id=uuid.uuid4(),
        session_id=uuid.uuid4(),
    )
    if method == "POST":
        return client.post(path, {})
    if method == "PATCH":
        return client.client.patch(path, b"{}", content_type="application/json", **client._headers(None))
    return getattr(client, method.lower())(path)


def test_every_operation_of_the_schema_is_in_the_matrix(db: None) -> None:
    assert _operations() - PUBLIC == set(REQUIRED)


@pytest.mark.parametrize("role", sorted(ROLE_MAY))
def test_role_and_scope_decide_every_call(make_tenant: Any, role: str) -> None:
    tenant = make_tenant()
    user = None if role == "tenant" else member(tenant, "admin")
    denied_by: dict[str, list[tuple[str, str, int]]] = {"scope": [], "role": []}
    for scope in sorted(set(REQUIRED.values())):
        client = key_for(tenant, user, [scope], role=None if user is None else role)
        for (method, template), needed in sorted(REQUIRED.items()):
            response = _call(client, method, template)
            allowed = scope == needed and needed in ROLE_MAY[role]
            where = (method, template, scope, role, response.status_code, response.content[:200])
            if allowed:
                assert response.status_code in (200, 400, 404, 415), where
            else:
                assert response.status_code == 403, where
                body = response.json()
                message = body["detail"] if "detail" in body else body["error"]["message"]
                reason = "scope" if scope != needed else "role"
                assert (needed in message) and (reason != "role" or role in message), where
                denied_by[reason].append((method, template, response.status_code))
    # The matrix exercised both kinds of refusal where the role has any to give.
    assert denied_by["scope"]
    assert bool(denied_by["role"]) == (ROLE_MAY[role] != set(REQUIRED.values()))


@pytest.mark.usefixtures("synth_worker")
def test_a_members_key_changes_only_its_own_users_jobs(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    alice, bob, boss = member(tenant, "member"), member(tenant, "member"), member(tenant, "admin")
    alices = key_for(tenant, alice, [READ, WRITE])
    bobs = key_for(tenant, bob, [READ, WRITE])
    admins = key_for(tenant, boss, [READ, WRITE])
    first = alices.post("/api/v1/speech", {"text": "Alice's first job."}).json()["id"]
    second = alices.post("/api/v1/speech", {"text": "Alice's second job."}).json()["id"]
    assert SynthesisJob.objects.get(pk=first).user_id == alice.pk
    # Bob sees the tenant's jobs but may not cancel or delete Alice's.
    assert bobs.get(f"/api/v1/speech/{first}").status_code == 200
    for response in (bobs.post(f"/api/v1/speech/{first}/cancel"), bobs.delete(f"/api/v1/speech/{first}")):
        assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert SynthesisJob.objects.filter(pk=first).exists()
    # Alice may (cancel answers 409 when the worker was faster); an admin may change anyone's.
    assert alices.post(f"/api/v1/speech/{first}/cancel").status_code in (200, 409)
    assert alices.delete(f"/api/v1/speech/{first}").status_code == 204
    assert admins.delete(f"/api/v1/speech/{second}").status_code == 204
    assert not SynthesisJob.objects.filter(pk__in=[first, second]).exists()
