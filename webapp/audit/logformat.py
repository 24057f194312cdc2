"""Log lines that name their request: a filter for every handler and a JSON formatter.

``TTS_LOG_FORMAT=json`` turns every process's lines (gunicorn, workers, beat)
into one JSON object per line; ``text`` (the default) keeps the plain format,
which shows the request id after the logger name ("-" outside a request).
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from webapp.audit import context


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` and ``job_id`` to every record (empty outside a request or job)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = context.current()
        record.request_id = (ctx.request_id if ctx else "") or "-"
        record.job_id = ctx.job_id if ctx else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        job_id = getattr(record, "job_id", "")
        if job_id:
            line["job_id"] = job_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
