"""The job lifecycle: every change of a job's state, each a public transition.

A package of four sides and the steps they share, each a module to read in one sitting:

- ``client``: ``submit_job``, ``cancel_job``, ``abandon_job``, ``delete_job``,
  ``report_handed`` (the one call of a transport: what it handed one client, and
  whether the answer goes on, was taken whole or was left), ``renew_waiter``,
  ``fail_jobs_of_deleted_voice``;
- ``worker``: ``claim_job``/``claim_next`` (the claim takes a fencing token),
  ``report_progress`` (renews the lease), ``complete_job``, ``fail_job``,
  ``requeue_job``, ``finish_canceled``, ``close_unclaimable``;
- ``beat``: ``reap_running`` (expired leases, stalls, deadlines, lapsed waiters),
  ``fail_queue_timeouts``;
- ``retention``: ``expire_audio``, ``blank_old_texts``;
- ``_core`` (private): ``_transition`` locks the row only if it is in a state the
  transition allows and changes it; ``_end`` ends a job and settles it.

Each public transition is an outer action (``transaction.atomic(durable=True)``)
that never calls another; the worker-side ones match only the current claim.
Every end settles the job's reservation through the ledger (which builds the
charge from what happened: a completion, a delivery to a client that left, a
failure) and publishes one ``JobEnded`` event in the same transaction
(``webapp.speech.services.events``); webhooks and the quota e-mail subscribe to
it. The lifecycle builds no payload, knows no URL and asks no broker. Nothing
outside this package writes a job's ``status`` (tests/unit/test_lifecycle_writes.py).
Leases, deadlines and progress times come from the database clock (``now()``).
"""

from webapp.speech.lifecycle.beat import fail_queue_timeouts, reap_running, requeue_expired_leases
from webapp.speech.lifecycle.client import (
    Handing,
    JobRequest,
    abandon_job,
    abandon_lapsed_waiters,
    answer_handed,
    cancel_job,
    delete_job,
    fail_jobs_of_deleted_voice,
    fail_jobs_of_revoked_consent,
    idempotent_replay,
    record_delivery,
    renew_session_waiters,
    renew_waiter,
    report_handed,
    request_fingerprint,
    submit_job,
)
from webapp.speech.lifecycle.retention import blank_old_texts, expire_audio
from webapp.speech.lifecycle.worker import (
    CLAIM_PROTOCOL,
    ProtocolMismatch,
    Verdict,
    batch_running,
    check_claim_protocol,
    claim_job,
    claim_next,
    close_unclaimable,
    complete_job,
    fail_job,
    finish_canceled,
    report_progress,
    requeue_job,
)

__all__ = [
    "Handing",
    "CLAIM_PROTOCOL",
    "JobRequest",
    "ProtocolMismatch",
    "Verdict",
    "abandon_job",
    "abandon_lapsed_waiters",
    "answer_handed",
    "batch_running",
    "blank_old_texts",
    "cancel_job",
    "check_claim_protocol",
    "claim_job",
    "claim_next",
    "close_unclaimable",
    "complete_job",
    "delete_job",
    "expire_audio",
    "fail_job",
    "fail_jobs_of_deleted_voice",
    "fail_jobs_of_revoked_consent",
    "fail_queue_timeouts",
    "finish_canceled",
    "idempotent_replay",
    "reap_running",
    "record_delivery",
    "renew_session_waiters",
    "renew_waiter",
    "report_handed",
    "report_progress",
    "request_fingerprint",
    "requeue_expired_leases",
    "requeue_job",
    "submit_job",
]
