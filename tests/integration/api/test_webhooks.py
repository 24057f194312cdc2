"""``/api/v1/webhooks`` and the outbox, in process, against a real receiver on 127.0.0.1.

Each attempt is made here with :func:`webapp.webhooks.delivery.deliver` and an
injected clock, so a day of retries takes no time; the worker, Redis restarts and
killed workers are tests/reliability/test_webhook_delivery.py's.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone
from standardwebhooks import Webhook

from tests import webhook_events
from tests.integration.api.conftest import problem
from tests.integration.api.people import member
from tests.webhook_receiver import Receiver, receiving

pytestmark = pytest.mark.usefixtures("builtin_voices")

MANAGE = ["speech:read", "speech:write", "keys:manage"]


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    import ipaddress

    settings.TTS_WEBHOOK_ALLOW_PRIVATE = [ipaddress.ip_network("127.0.0.0/8")]
    settings.TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.TTS_WEBHOOK_READ_TIMEOUT_SECONDS = 2.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


@pytest.fixture
def tenant(make_tenant: Any) -> Any:
    t = make_tenant(scopes=MANAGE, monthly_characters=100)
    t.owner = member(t, "owner")
    t.owner.email = "owner@example.com"
    t.owner.save()
    return t


def _endpoint(tenant: Any, receiver: Receiver, name: str, events: list[str] | None = None) -> dict[str, Any]:
    from webapp.webhooks.models import SUBSCRIBABLE

    response = tenant.client.post(
        "/api/v1/webhooks", {"url": receiver.url(name), "events": events or SUBSCRIBABLE, "description": name}
    )
    assert response.status_code == 201, response.content
    body: dict[str, Any] = response.json()
    receiver.secrets[name] = body["secret"]
    return body


def _deliver_all(now: dt.datetime | None = None) -> list[str]:
    """One attempt at every due message, as the worker would make them."""
    from webapp.webhooks import delivery
    from webapp.webhooks.models import WebhookMessage

    now = now or timezone.now()
    due = WebhookMessage.objects.filter(status="pending", next_attempt_at__lte=now).order_by("created_at")
    return [delivery.deliver(m.id, now=now) for m in due]


def test_it_creates_lists_changes_and_deletes_an_endpoint_whose_secret_is_shown_once(
    tenant: Any, receiver: Receiver
) -> None:
    body = _endpoint(tenant, receiver, "crud", ["job.succeeded", "job.failed"])
    assert body["secret"].startswith("whsec_") and body["events"] == ["job.failed", "job.succeeded"]
    listed = tenant.client.get("/api/v1/webhooks").json()["results"]
    assert [e["id"] for e in listed] == [body["id"]] and "secret" not in listed[0]
    assert listed[0]["secret_prefix"] == body["secret"][:10]
    path = f"/api/v1/webhooks/{body['id']}"
    changed = tenant.client.client.patch(
        path,
        json.dumps({"enabled": False, "description": "off"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}",
    )
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert tenant.client.delete(path).status_code == 204
    assert problem(tenant.client.get(path))["code"] == "not_found"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "http://example.com/hook",  # plain http to a public name
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::ffff:10.0.0.1]/hook",
        "https://user:pw@example.com/hook",
        "not a url",
    ],
)
def test_it_refuses_an_endpoint_url_it_may_not_call(tenant: Any, url: str) -> None:
    response = tenant.client.post("/api/v1/webhooks", {"url": url, "events": ["job.succeeded"]})
    body = problem(response)
    assert response.status_code == 400 and "url" in json.dumps(body)


def test_a_key_without_keys_manage_cannot_touch_webhooks(make_tenant: Any) -> None:
    t = make_tenant()
    assert problem(t.client.get("/api/v1/webhooks"))["code"] == "permission_denied"


def test_a_submit_names_its_own_webhook_url_and_a_bad_one_is_a_400(tenant: Any, receiver: Receiver) -> None:
    response = tenant.client.post(
        "/api/v1/speech", {"text": "Hello.", "voice": "espeak-en-us", "webhook_url": "https://127.0.0.2:1/x"}
    )
    assert response.status_code != 400 or "webhook_url" not in response.content.decode()
    bad = tenant.client.post(
        "/api/v1/speech", {"text": "Hello.", "voice": "espeak-en-us", "webhook_url": "http://192.168.1.1/x"}
    )
    assert bad.status_code == 400 and "webhook_url" in json.dumps(problem(bad))
    secret = tenant.client.post("/api/v1/webhooks/job-secret").json()["secret"]
    receiver.secrets["own"] = secret
    job = webhook_events.fail(tenant.org, webhook_url=receiver.url("own"))
    assert _deliver_all() == ["delivered"]
    assert receiver.events("own") == [("job.failed", str(job.id))]
    assert receiver.unique[0].payload["data"]["error"]["code"] == "synthesis_failed"


def test_every_event_arrives_once_per_endpoint_after_two_500s(tenant: Any, receiver: Receiver) -> None:
    from webapp.webhooks.models import WebhookAttempt, WebhookMessage

    _endpoint(tenant, receiver, "a")
    _endpoint(tenant, receiver, "b")
    receiver.fail_first = 2
    made = webhook_events.every_event(tenant.org)
    assert len(made) == 9
    now = timezone.now()
    for _ in range(3):
        _deliver_all(now)
        now += dt.timedelta(seconds=60)  # past every backoff of the first attempts (5 s, 10 s, jittered)
    assert set(receiver.events("a")) == set(receiver.events("b")) == made
    assert len(receiver.unique) == 2 * len(made) and not receiver.rejected
    assert set(receiver.seen.values()) == {3}  # the same webhook-id each time
    message = WebhookMessage.objects.filter(endpoint__description="a").first()
    assert message is not None and message.status == "delivered" and message.attempts == 3
    log = list(WebhookAttempt.objects.filter(message=message).order_by("started_at"))
    assert [a.status_code for a in log] == [500, 500, 200] and '"status": 500' in log[0].response_excerpt


def test_retries_back_off_then_give_up_and_a_day_of_failures_disables_the_endpoint(
    tenant: Any, receiver: Receiver, mailoutbox: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    from webapp.webhooks import delivery
    from webapp.webhooks.models import WebhookAttempt, WebhookEndpoint, WebhookMessage

    body = _endpoint(tenant, receiver, "down")
    receiver.fail_first = 10**6
    job = webhook_events.fail(tenant.org)
    message = WebhookMessage.objects.get(event="job.failed")
    start, now, waits = message.created_at, message.created_at, []
    while True:
        with django_capture_on_commit_callbacks(execute=True):  # the owners' mail goes at commit
            outcome = delivery.deliver(message.id, now=now)
        message.refresh_from_db()
        if outcome != "retry":
            break
        waits.append((message.next_attempt_at - now).total_seconds())
        now = message.next_attempt_at
    assert outcome == "failed" and message.status == "failed"
    assert 2.5 <= waits[0] <= 5 and 5 <= waits[1] <= 10 and max(waits) <= 3600
    assert now - start == dt.timedelta(hours=24)  # the last attempt at the window's end
    endpoint = WebhookEndpoint.objects.get(id=body["id"])
    assert not endpoint.enabled and "failed for 24 hours" in endpoint.disabled_reason
    assert [m.to for m in mailoutbox] == [["owner@example.com"]] and body["url"] in mailoutbox[0].body
    # Its message was given up, not lost: it is the job's, and the log shows every attempt.
    assert message.payload["data"]["id"] == str(job.id)
    assert message.attempts == len(waits) + 1
    # (The receiver answers 500, and 400 once the simulated clock has left its timestamp tolerance.)
    codes = list(WebhookAttempt.objects.filter(message=message).values_list("status_code", flat=True))
    assert len(codes) == message.attempts and all(code is not None and code >= 400 for code in codes)


def test_a_redelivery_keeps_the_webhook_id_and_the_receiver_drops_it(tenant: Any, receiver: Receiver) -> None:
    endpoint = _endpoint(tenant, receiver, "re")
    ping = tenant.client.post(f"/api/v1/webhooks/{endpoint['id']}/ping")
    assert ping.status_code == 202 and ping.json()["event"] == "ping"
    assert _deliver_all() == ["delivered"]
    again = tenant.client.post(f"/api/v1/webhooks/deliveries/{ping.json()['id']}/redeliver")
    assert again.status_code == 202 and again.json()["webhook_id"] == ping.json()["webhook_id"]
    assert _deliver_all() == ["delivered"]
    assert receiver.seen == {ping.json()["webhook_id"]: 2} and len(receiver.unique) == 1
    listed = tenant.client.get(f"/api/v1/webhooks/{endpoint['id']}/deliveries").json()["results"]
    assert [len(d["attempt_log"]) for d in listed] == [2] and listed[0]["status"] == "delivered"


def test_a_rotated_secret_and_the_old_one_both_verify_during_the_overlap(
    tenant: Any, receiver: Receiver
) -> None:
    from webapp.webhooks import delivery
    from webapp.webhooks.models import WebhookEndpoint

    endpoint = _endpoint(tenant, receiver, "rot")
    old = endpoint["secret"]
    rotated = tenant.client.post(
        f"/api/v1/webhooks/{endpoint['id']}/rotate-secret", {"overlap_seconds": 3600}
    )
    new = rotated.json()["secret"]
    assert rotated.status_code == 200 and new != old
    row = WebhookEndpoint.objects.get(id=endpoint["id"])
    now = timezone.now()
    header = delivery.sign(row.signing_secrets(now), "msg_1", now, "{}")
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": header,
    }
    for secret in (old, new):
        assert Webhook(secret).verify("{}", headers) == {}
    assert row.signing_secrets(now + dt.timedelta(hours=2)) == [new]


def test_a_replay_older_than_the_tolerance_is_rejected_by_the_receiver_library(
    tenant: Any, receiver: Receiver
) -> None:
    from webapp import outbound as net
    from webapp.webhooks import delivery

    endpoint = _endpoint(tenant, receiver, "replay")
    then = timezone.now() - dt.timedelta(minutes=10)
    body = '{"type":"ping","timestamp":"x","data":{}}'
    headers = {
        "Content-Type": "application/json",
        "webhook-id": "msg_replayed",
        "webhook-timestamp": str(int(then.timestamp())),
        "webhook-signature": delivery.sign([endpoint["secret"]], "msg_replayed", then, body),
    }
    answer = net.post(receiver.url("replay"), body.encode(), headers)
    assert answer.status == 400 and not receiver.unique
    assert any("too old" in why.lower() for why in receiver.rejected), receiver.rejected


def _lose_wake_ups() -> None:
    """The webhooks queue's wake-ups gone, as with a Redis restarted without its data."""
    from webapp.celery import app

    with app.connection_or_acquire() as connection:
        connection.default_channel.client.delete("webhooks")


def test_the_sweep_replaces_lost_wake_ups_and_adds_none_past_a_tenants_share(
    tenant: Any, receiver: Receiver
) -> None:
    from webapp.webhooks import delivery
    from webapp.webhooks.models import WebhookMessage

    _endpoint(tenant, receiver, "swept")
    webhook_events.cancel(tenant.org)
    message = WebhookMessage.objects.get(event="job.canceled")
    _lose_wake_ups()
    now = timezone.now()
    assert delivery.sweep(now) == 1  # due, and nothing in the queue would wake it
    assert delivery.sweep(now) == 0  # the wake-up just sent is waiting
    _lose_wake_ups()
    WebhookMessage.objects.filter(id=message.id).update(status="delivered")
    assert delivery.sweep(now) == 0
    # Six due messages of a tenant with two in flight (its share): nothing could go now.
    for _ in range(8):
        webhook_events.cancel(tenant.org)
    due = list(
        WebhookMessage.objects.filter(organization=tenant.org, status="pending").order_by("created_at")
    )
    assert len(due) == 8
    leased = [m.id for m in due[:2]]
    now = timezone.now()
    WebhookMessage.objects.filter(id__in=leased).update(lease_until=now + dt.timedelta(seconds=30))
    _lose_wake_ups()
    assert delivery.sweep(now) == 0
    assert delivery.deliver(now=now) == "skipped"  # a wake-up takes none of them either
    WebhookMessage.objects.filter(id=leased[0]).update(lease_until=None, status="delivered")
    assert delivery.sweep(now) == 1
    assert delivery.deliver(now=now) == "delivered"  # a wake-up naming none takes the longest due
    assert WebhookMessage.objects.get(id=due[2].id).status == "delivered"


def test_an_attempt_cut_off_backs_off_and_counts_as_a_failure(
    tenant: Any, receiver: Receiver, settings: Any
) -> None:
    from webapp.webhooks import delivery
    from webapp.webhooks.models import WebhookAttempt, WebhookEndpoint, WebhookMessage

    body = _endpoint(tenant, receiver, "cut")
    webhook_events.cancel(tenant.org)
    message = WebhookMessage.objects.get(event="job.canceled")
    now = timezone.now()
    # The attempt is taken, then its child is killed at the time limit: nothing is recorded.
    taken = delivery._take(message.id, now)
    assert taken is not None and taken.attempts == 1
    lapsed = now + dt.timedelta(seconds=delivery.lease_seconds() + 1)
    assert delivery.deliver(message.id, now=lapsed) == "skipped"  # it waits out a backoff
    taken.refresh_from_db()
    later = taken.next_attempt_at
    assert later >= lapsed + dt.timedelta(seconds=settings.TTS_WEBHOOK_RETRY_BASE_SECONDS / 2 - 1)
    assert delivery.deliver(message.id, now=later) == "delivered"
    log = list(WebhookAttempt.objects.filter(message=message).order_by("started_at"))
    assert [(a.status_code, a.error.startswith("cut off")) for a in log] == [(None, True), (200, False)]
    assert log[0].started_at == now
    endpoint = WebhookEndpoint.objects.get(id=body["id"])
    assert endpoint.failing_since is None  # marked failing by the cut-off, cleared by the delivery


def test_pings_and_redeliveries_have_an_hourly_budget(tenant: Any, receiver: Receiver, settings: Any) -> None:
    from django.core.cache import cache

    from webapp.webhooks.models import WebhookMessage

    settings.TTS_WEBHOOK_MANUAL_SENDS_PER_HOUR = 2
    cache.clear()
    endpoint = _endpoint(tenant, receiver, "budget")
    first = tenant.client.post(f"/api/v1/webhooks/{endpoint['id']}/ping")
    assert first.status_code == 202
    assert tenant.client.post(f"/api/v1/webhooks/{endpoint['id']}/ping").status_code == 202
    refused = tenant.client.post(f"/api/v1/webhooks/deliveries/{first.json()['id']}/redeliver")
    assert refused.status_code == 429 and problem(refused)["code"] == "rate_limited"
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert tenant.client.post(f"/api/v1/webhooks/{endpoint['id']}/ping").status_code == 429
    assert WebhookMessage.objects.filter(organization=tenant.org).count() == 2


def test_the_schema_describes_the_webhooks_api(db: None) -> None:
    from django.test import Client
    from openapi_spec_validator import validate

    spec = Client().get("/api/v1/schema", {"format": "json"}).json()
    validate(spec)
    paths = spec["paths"]
    for path in (
        "/api/v1/webhooks",
        "/api/v1/webhooks/{endpoint_id}",
        "/api/v1/webhooks/{endpoint_id}/rotate-secret",
        "/api/v1/webhooks/{endpoint_id}/ping",
        "/api/v1/webhooks/{endpoint_id}/deliveries",
        "/api/v1/webhooks/deliveries/{delivery_id}/redeliver",
        "/api/v1/webhooks/job-secret",
    ):
        assert path in paths, sorted(p for p in paths if "webhook" in p)


def test_webhooks_have_their_own_worker_queue_and_beat_sweep() -> None:
    """A slow receiver holds only a webhooks worker: the tasks' queue, make run's worker, beat's sweep."""
    from django.conf import settings

    from deploy.provision import StackConfig
    from deploy.stack import app_services
    from webapp.env import worker_queues
    from webapp.webhooks import tasks

    assert getattr(tasks.deliver, "queue") == getattr(tasks.sweep, "queue") == "webhooks"  # noqa: B009
    assert worker_queues("webhooks", ["piper"]) == ["webhooks"]
    assert "webhooks" not in worker_queues("synth", ["piper", "espeak"])
    entry: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE["webhooks.sweep"]
    assert entry["task"] == "webhooks.sweep" and entry["options"]["queue"] == "webhooks"
    services = {s.name: s for s in app_services(StackConfig.for_tests())}
    webhooks = services["webhooks"]
    assert webhooks.env["TTS_WORKER_ROLE"] == "webhooks" and not webhooks.required
    assert webhooks.command[webhooks.command.index("-Q") + 1] == "webhooks"


@pytest.mark.parametrize("limit", ["²", "0", "101", "-1", "1e3", "9" * 30, ""])
def test_a_deliveries_limit_that_is_not_a_plain_number_in_range_is_a_400(tenant: Any, limit: str) -> None:
    endpoint = tenant.client.post(
        "/api/v1/webhooks", {"url": "http://127.0.0.1:9/x", "events": ["job.succeeded"]}
    ).json()
    answer = tenant.client.get(f"/api/v1/webhooks/{endpoint['id']}/deliveries", {"limit": limit})
    assert answer.status_code == 400, answer.content
    assert problem(answer)["code"] == "invalid_limit"


def test_an_edit_made_while_the_service_disables_the_endpoint_keeps_it_disabled(tenant: Any) -> None:
    from webapp.webhooks import services
    from webapp.webhooks.models import WebhookEndpoint

    made = tenant.client.post(
        "/api/v1/webhooks", {"url": "https://hooks.example.com/x", "events": ["job.succeeded"]}
    ).json()
    seen = WebhookEndpoint.objects.get(pk=made["id"])  # what the edit's request loaded
    WebhookEndpoint.objects.filter(pk=seen.pk).update(enabled=False, disabled_reason="Every delivery failed.")
    services.update_endpoint(seen, {"description": "renamed"})
    now = WebhookEndpoint.objects.get(pk=seen.pk)
    assert (now.description, now.enabled, now.disabled_reason) == ("renamed", False, "Every delivery failed.")


@pytest.mark.django_db(transaction=True)
def test_two_creates_at_once_never_pass_the_endpoint_limit(make_tenant: Any, monkeypatch: Any) -> None:
    """The first create pauses between its count and its insert; the second must wait for it."""
    import threading

    from django.db import connection

    from webapp.errors import DomainError
    from webapp.webhooks import delivery, services
    from webapp.webhooks.models import WebhookEndpoint

    t = make_tenant(scopes=["speech:read", "speech:write", "keys:manage"])
    for n in range(services.MAX_ENDPOINTS - 1):
        services.create_endpoint(t.org, f"https://hooks.example.com/{n}", [])
    inside, second_done = threading.Event(), threading.Event()
    stock = delivery.rotate

    def paused(holder: Any, now: Any = None) -> str:
        if threading.current_thread().name == "first":
            inside.set()
            second_done.wait(3)  # without the lock, the second create ends meanwhile
        return stock(holder, now)

    monkeypatch.setattr(delivery, "rotate", paused)
    outcomes: dict[str, str] = {}

    def create(name: str) -> None:
        try:
            services.create_endpoint(t.org, f"https://hooks.example.com/{name}", [])
            outcomes[name] = "created"
        except DomainError:
            outcomes[name] = "refused"
        finally:
            if name == "second":
                second_done.set()
            connection.close()

    first = threading.Thread(target=create, args=("first",), name="first")
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=create, args=("second",), name="second")
    second.start()
    first.join(15)
    second.join(15)
    assert outcomes == {"first": "created", "second": "refused"}
    assert WebhookEndpoint.objects.filter(organization=t.org).count() == services.MAX_ENDPOINTS
