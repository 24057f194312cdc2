"""Every state change of voices, jobs and usage, each inside one transaction.

Views parse and authorise, tasks are thin; both call these modules, each
imported from where it lives (there is no facade here):

- ``jobs``: the job state machine (submit, claim, progress, complete, fail,
  cancel, requeue, reap, delete, expire);
- ``dispatch``: the outbox sender (Celery messages after commit, re-sends);
- ``ledger``: usage periods, limits, reserve / charge / release;
- ``eta``: queue position and ETA;
- ``queries``: read models for the views and the admin;
- ``voices``: built-in voice sync and tenant voice deletion;
- ``files``: where stored files live under MEDIA_ROOT.

Each public action opens the outermost transaction
(``transaction.atomic(durable=True)``) and never calls another public action;
shared steps are private functions or ledger steps that run inside the
caller's transaction. Services raise ``webapp.errors.DomainError``; they know
nothing of HTTP.
"""
