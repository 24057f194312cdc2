"""The domain services below the job lifecycle, each imported from where it lives (no facade).

- ``ledger``: usage periods, limits, the reservation and the one settlement;
- ``dispatch``: the dispatch port (Celery messages sent by task name after commit);
- ``eta``: queue position and ETA;
- ``queries``: read models for the views and the admin;
- ``prompts``: uploaded voice prompts and their analysis state;
- ``notify``: job and stream notifications after commit;
- ``waits``: a tenant's wait slots;
- ``files`` and ``outputs``: where stored files live, an attempt's own files.

A job's state changes only in ``webapp.speech.lifecycle``, which builds on these;
actions that combine transitions sit above it (``webapp.speech.submission``,
``voices``, ``operator``). Each public action opens the outermost transaction
(``transaction.atomic(durable=True)``) and never calls another public action;
shared steps run inside the caller's transaction. Services raise
``webapp.errors.DomainError``; they know nothing of HTTP.
"""
