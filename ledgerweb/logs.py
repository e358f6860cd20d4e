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
            if name in _STANDARD or name.startswith("_"):
                continue
            if name == "request" and hasattr(value, "method") and hasattr(value, "path"):
                # Django's request lines pass the request itself: its parts, not its repr.
                entry.setdefault("method", value.method)
                entry.setdefault("path", value.path)
                continue
            entry[name] = (
                value if isinstance(value, str | int | float | bool | None) else str(value)
            )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def json_line(message: str, *, logger: str, level: int = logging.INFO, **fields) -> str:
    """One JSON log line for text a command prints itself (the worker's pass lines), in the
    same shape as the logging formatter's."""
    record = logging.LogRecord(logger, level, "", 0, message, None, None)
    record.__dict__.update(fields)
    return JsonFormatter().format(record)


# gunicorn's access-log atoms (gunicorn.glogging.Logger.atoms) as named fields.
_ACCESS_FIELDS = {
    "h": "remote_addr",
    "m": "method",
    "U": "path",
    "q": "query",
    "H": "protocol",
    "s": "status",
    "B": "bytes",
    "M": "duration_ms",
    "f": "referer",
    "a": "user_agent",
    # The request's id as the server answered it (ledgerweb/request_context.py), the agent's
    # trace context as it came.
    "{x-request-id}o": "request_id",
    "{traceparent}i": "traceparent",
}


class GunicornAccessJsonFormatter(JsonFormatter):
    """gunicorn's access line as JSON, with the request's parts as fields."""

    def format(self, record: logging.LogRecord) -> str:
        atoms = record.args
        if hasattr(atoms, "__getitem__") and not isinstance(atoms, tuple):
            for atom, name in _ACCESS_FIELDS.items():
                try:
                    value = atoms[atom]
                except (KeyError, TypeError):
                    continue
                if value not in (None, "-", ""):
                    setattr(record, name, value)
        return super().format(record)


def gunicorn_logger_class():
    """gunicorn's logger with its error and access lines as JSON (``LEDGERWEB_LOG_FORMAT=json``;
    gunicorn.conf.py names it). Imported by gunicorn only, so the server's other processes never
    import gunicorn for it."""
    from gunicorn.glogging import Logger

    class JsonLogger(Logger):
        def setup(self, cfg) -> None:
            super().setup(cfg)
            for handler in self.error_log.handlers:
                handler.setFormatter(JsonFormatter())
            for handler in self.access_log.handlers:
                handler.setFormatter(GunicornAccessJsonFormatter())

    return JsonLogger


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


def warnings_as_log_lines() -> None:
    """With JSON logs, Python's warnings (printed straight to stderr otherwise) become log
    records too, so every line a server process writes is one JSON object. Process-wide, like
    ``skip_unused_record_fields``: the server's own processes call it."""
    from django.conf import settings

    if settings.LOGGING["handlers"]["console"]["formatter"] == "json":
        logging.captureWarnings(True)
