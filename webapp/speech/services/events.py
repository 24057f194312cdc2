"""What happened to a job or a voice, told to whoever subscribed: one typed event per fact.

The lifecycle and the voice services publish; other packages subscribe where
they start (their ``AppConfig.ready``) and read what else they need themselves:
the webhooks package writes its outbox, the owners' quota e-mail goes out. A
publisher knows none of them.

A subscriber runs either inside the publishing transaction (``after_commit=False``,
for writes that must commit with the fact or not at all: the webhook outbox is the
durable record of an event, so writing it after the commit could lose it to a crash
in between), or once that transaction committed (``after_commit=True``, for work
outside the database, such as mail; robust: its failure is logged, the fact stands).
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import transaction

from webapp.speech.services.ledger import Settlement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobEnded:
    """A job reached an end state (succeeded, failed, canceled) in this transaction.

    ``settlement``: what ending it charged; None when nothing was settled with it (a
    job whose waiting client is still being handed its answer is settled by
    :class:`JobSettled` later, or one settled before it ended).
    """

    job_id: Any
    status: str
    settlement: Settlement | None


@dataclass(frozen=True)
class JobSettled:
    """A job was settled apart from its end (its answer handed, its client gone while it ran)."""

    job_id: Any
    settlement: Settlement


@dataclass(frozen=True)
class VoiceDecided:
    """A tenant's voice was analysed: ``status`` is ready or rejected."""

    voice_pk: Any
    organization_id: Any
    status: str


@dataclass(frozen=True)
class SessionEnded:
    """A realtime session closed (its row holds the totals): one event per session, not per unit."""

    session_id: Any
    organization_id: Any


Event = JobEnded | JobSettled | VoiceDecided | SessionEnded
E = TypeVar("E", JobEnded, JobSettled, VoiceDecided, SessionEnded)
Handler = Callable[[Any], None]

_in_transaction: dict[type, list[Handler]] = defaultdict(list)
_after_commit: dict[type, list[Handler]] = defaultdict(list)


def subscribe(event_type: type[E], handler: Callable[[E], None], *, after_commit: bool = False) -> None:
    """Call ``handler`` with every ``event_type`` published (once, however often this is called)."""
    handlers = (_after_commit if after_commit else _in_transaction)[event_type]
    if handler not in handlers:
        handlers.append(handler)


def publish(event: Event) -> None:
    """Inside the transaction that made the fact: its in-transaction subscribers now, the others at commit."""
    for handler in _in_transaction[type(event)]:
        handler(event)
    for handler in _after_commit[type(event)]:
        transaction.on_commit(functools.partial(handler, event), robust=True)
