"""Structured logs: one JSON object per line when ``LEDGERWEB_LOG_FORMAT=json``.

Ledger code logs events as ``"attempt.confirmed attempt_id=... tenant=..."`` and passes the same
values in ``extra``; the JSON formatter puts those fields at the top level, so a log pipeline can
filter by ``attempt_id`` without parsing the message.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

# Attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = (
                    value if isinstance(value, str | int | float | bool | None) else str(value)
                )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def skip_unused_record_fields() -> None:
    """Stop filling log record fields no configured format prints: the caller's file, line and
    function (a walk up the stack for every line), the thread, and the multiprocessing and
    asyncio task names (the logging HOWTO, "Optimization"). The process id stays: gunicorn's
    error log prints it. The ledger logs a line for every change, so this is per request.

    Process-wide: called by the server's own processes (``ledgerweb.wsgi``, the reconcile
    worker), never by the settings, so a program that merely imports Django keeps its logging."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    logging.logAsyncioTasks = False
