"""What a child serving remote models runs beside its jobs: the voices kept on their replicas.

Given a registry (services/upstream_voices.py), a remote model with ``register_voices`` keeps
cloned voices on its replicas (synth/engines/remote.py); a thread of the child then tries the
deletions owed to those replicas every ``TTS_REMOTE_VOICE_DELETE_SECONDS`` until each confirms.
Every relay child does, so a deletion waits for no particular one; a row lock keeps two from
trying the same one at once.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections

from synth.engines import remote
from webapp.speech.runtime import mode
from webapp.speech.services import upstream_voices

log = logging.getLogger(__name__)


def start(engines: list[str], models: dict[str, dict[str, object]]) -> None:
    """In a loaded child: keep voices upstream for the remote models it serves, if any."""
    relayed = [engine for engine in engines if mode.relays(engine, models)]
    if not relayed:
        return
    remote.use_voice_registry(upstream_voices.Registry())
    threading.Thread(
        target=_delete_forever, args=(relayed,), name="upstream-voice-deletions", daemon=True
    ).start()


def _delete_forever(engines: list[str]) -> None:
    while True:
        time.sleep(settings.TTS_REMOTE_VOICE_DELETE_SECONDS)
        try:
            upstream_voices.delete_owed(engines, remote.forget_voice)
        except (OperationalError, InterfaceError) as exc:
            log.warning("upstream voice deletions: database unreachable (%s); next round later", exc)
        except Exception:
            log.exception("upstream voice deletions failed; next round later")
        finally:
            connections.close_all()  # this thread's own connection, not held between rounds
