"""The webhook tasks, on their own ``webhooks`` queue: a slow receiver holds only a webhooks worker.

``webhooks.deliver`` is acknowledged late and rejected back to the queue when its
worker child dies (the settings' defaults), and its hard time limit is the
message's lease, so a stuck attempt ends before another may take the message.
A message is a wake-up (its id, when it names one, is tried first; webapp/webhooks/delivery.py).
``webhooks.sweep`` (beat, every TTS_WEBHOOK_SWEEP_SECONDS) replaces the wake-ups that were lost.
"""

from __future__ import annotations

from typing import Any

# The project's app, as every task of this service: a worker must use the configured broker.
from webapp.celery import app
from webapp.webhooks import delivery
from webapp.webhooks.outbox import DELIVER_TASK, QUEUE


@app.task(
    name=DELIVER_TASK,
    queue=QUEUE,
    ignore_result=True,
    time_limit=max(1, int(delivery.lease_seconds()) - 1),
)
def deliver(message_id: str | None = None) -> str:
    return delivery.deliver(message_id)


@app.task(name="webhooks.sweep", queue=QUEUE, ignore_result=True, acks_late=False)
def sweep() -> dict[str, Any]:
    return {"resent": delivery.sweep()}
