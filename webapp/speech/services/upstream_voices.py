"""Cloned voices kept on remote models' replicas: their registrations, and the deletions owed.

A remote model with ``register_voices`` (synth/engines/remote.py) uploads a cloned voice to each
replica the first time that replica speaks it, then names it there. Each registration is a row
(``UpstreamVoice``) written before its upload starts. Deleting the voice, by whatever path, sets
the row's voice to NULL (``on_delete=SET_NULL``): a deletion owed to that replica, which a relay
worker tries (:func:`delete_owed`) until the replica confirms, backing off between tries. The rows
are the record an operator reads of which replicas hold, or may hold, whose voice.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from webapp.speech.models import UpstreamVoice

log = logging.getLogger(__name__)

# An upload neither confirmed nor refused this long ago is taken over by the next use of the voice.
UPLOAD_STALE = dt.timedelta(seconds=60)
# Seconds before the next try of a deletion a replica did not confirm, by tries made so far.
DELETE_BACKOFF = (5, 15, 60, 300, 900)
# A deletion being tried is skipped by the other relays this long (one try's connect timeout and more).
DELETE_CLAIM = dt.timedelta(seconds=60)


class Registry:
    """The worker's :class:`synth.engines.remote.VoiceRegistry`: registrations in the database."""

    def registered_name(self, model: str, url: str, key: str) -> str | None:
        return (
            UpstreamVoice.objects.filter(
                engine=model, upstream=url, voice_id=key, registered_at__isnull=False
            )
            .values_list("name", flat=True)
            .first()
        )

    def begin(self, model: str, url: str, key: str, name: str) -> bool:
        now = timezone.now()
        try:
            with transaction.atomic():
                row, created = UpstreamVoice.objects.get_or_create(
                    engine=model,
                    upstream=url,
                    name=name,
                    defaults={"voice_id": key, "upload_started_at": now},
                )
        except IntegrityError:  # the voice was deleted meanwhile: nothing to register
            return False
        if created:
            return True
        if row.voice_id is None or str(row.voice_id) != key or row.registered_at is not None:
            return False
        # Another upload started and never ended (its worker died): take it over, once.
        taken = UpstreamVoice.objects.filter(
            pk=row.pk, registered_at__isnull=True, upload_started_at__lt=now - UPLOAD_STALE
        ).update(upload_started_at=now)
        return taken == 1

    def ended(self, model: str, url: str, key: str, ok: bool) -> None:
        if ok:
            UpstreamVoice.objects.filter(engine=model, upstream=url, voice_id=key).update(
                registered_at=timezone.now()
            )
        # A failed upload is tried again once it is stale (UPLOAD_STALE); the row stays meanwhile, as
        # the replica may have kept the audio of an upload whose answer was lost.

    def lost(self, model: str, url: str, key: str) -> None:
        UpstreamVoice.objects.filter(engine=model, upstream=url, voice_id=key).update(
            registered_at=None, upload_started_at=timezone.now() - UPLOAD_STALE
        )

    def in_background(self, work: Callable[[], None]) -> None:
        def run() -> None:
            try:
                work()
            except Exception:
                log.exception("a voice's upstream registration failed")
            finally:
                connections.close_all()  # this thread's own connection

        threading.Thread(target=run, name="upstream-voice-upload", daemon=True).start()


def delete_owed(
    engines: Iterable[str], forget: Callable[[str, str, str], tuple[bool, str]], limit: int = 20
) -> int:
    """Try the deletions owed on ``engines``' replicas that are due; how many replicas confirmed.

    ``forget(model, url, name)``: the replica's answer, (confirmed, what it said). A deletion is
    taken under a row lock (skipped by other relays) and tried outside any transaction.
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        due = list(
            UpstreamVoice.objects.select_for_update(skip_locked=True)
            .filter(voice__isnull=True, engine__in=list(engines))
            .filter(Q(next_delete_at__isnull=True) | Q(next_delete_at__lte=now))
            .order_by("id")[:limit]
        )
        UpstreamVoice.objects.filter(pk__in=[row.pk for row in due]).update(next_delete_at=now + DELETE_CLAIM)
    confirmed = 0
    for row in due:
        ok, said = forget(row.engine, row.upstream, row.name)
        if ok:
            UpstreamVoice.objects.filter(pk=row.pk).delete()
            log.info("voice %s deleted on %s (%s)", row.name, row.upstream, said)
            confirmed += 1
            continue
        pause = DELETE_BACKOFF[min(row.delete_attempts, len(DELETE_BACKOFF) - 1)]
        log.warning("voice %s not yet deleted on %s: %s; again in %d s", row.name, row.upstream, said, pause)
        UpstreamVoice.objects.filter(pk=row.pk).update(
            delete_attempts=F("delete_attempts") + 1,
            next_delete_at=timezone.now() + dt.timedelta(seconds=pause),
            last_error=said[:300],
        )
    return confirmed


def counts() -> dict[tuple[str, str], dict[str, int]]:
    """Per (model, replica): the voices registered there, and the deletions owed to it."""
    rows = UpstreamVoice.objects.values("engine", "upstream").annotate(
        kept=Count("id", filter=Q(voice__isnull=False, registered_at__isnull=False)),
        owed=Count("id", filter=Q(voice__isnull=True)),
    )
    return {(r["engine"], r["upstream"]): {"kept": r["kept"], "owed": r["owed"]} for r in rows}
