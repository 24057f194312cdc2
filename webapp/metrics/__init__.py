"""``/metrics`` in the Prometheus text format.

- ``http``: requests by view, method and status with latency histograms, counted
  in each app-server process; under gunicorn in prometheus-client's
  multiprocess mode (``multiproc``), so one scrape adds up all processes.
- ``rollup``: job and ledger counters, derived from the rows once a minute
  (and at each scrape) into Redis, so jobs finished by any process (a worker,
  housekeeping, an API cancel) are counted without a hook in the state changes.
- ``collector``: everything read at scrape time: jobs per state, queue depths,
  worker children from their heartbeats (no metrics port on worker hosts).
- ``views``: the endpoint, answered only to TTS_METRICS_ALLOWED_IPS.
"""
