"""Each request's identity in every log line it causes: its request id, the agent's trace id and
the attempt it concerns.

The request id is the caller's ``X-Request-ID`` when it is a sane token (what a load balancer or
an agent's HTTP library sets: 1-128 letters, digits and ``-_.:/+=@``), else a new one; the
response carries it back in ``X-Request-ID``. The trace id comes from a valid W3C
``traceparent``. The attempt id is the URL's, or the one the ledger names when it records an
intent. ``RequestContextFilter`` (on the console handler, ledgerweb/settings.py) puts the three on
every log record made while the request runs, as fields of the JSON line.
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

from django.core.signals import request_finished

HEADER = "X-Request-ID"
_META_HEADER = "HTTP_X_REQUEST_ID"
_VALID_ID = re.compile(r"^[A-Za-z0-9\-_.:/+=@]{1,128}$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
FIELDS = ("request_id", "trace_id", "attempt_id")

_current: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "ledgerweb_request", default=None
)


def request_id_from(header: str | None) -> str:
    """The caller's id when it is one a log line can carry as it is, else a new one."""
    if header and _VALID_ID.match(header):
        return header
    return uuid.uuid4().hex


def trace_id_from(traceparent: str | None) -> str | None:
    match = _TRACEPARENT.match((traceparent or "").strip())
    if not match or match[1] == "0" * 32:
        return None
    return match[1]


def current() -> dict[str, str]:
    """The running request's fields (empty outside a request)."""
    return dict(_current.get() or {})


def note_attempt(attempt_id: object) -> None:
    """The attempt the running request concerns, from here on (no-op outside a request)."""
    fields = _current.get()
    if fields is not None and attempt_id:
        fields["attempt_id"] = str(attempt_id)


class RequestIdMiddleware:
    """First in the middleware: every later line of the request, and its response, carry the id."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        # From META, not request.headers: that mapping is built from every header of the
        # request on first use, and an agent's call would build it for these two alone.
        request_id = request_id_from(request.META.get(_META_HEADER))
        fields = {"request_id": request_id}
        if trace_id := trace_id_from(request.META.get("HTTP_TRACEPARENT")):
            fields["trace_id"] = trace_id
        request.request_id = request_id
        # Kept until the response is closed (request_finished), not only while the middleware
        # runs: Django logs a 4xx or 5xx answer after the middleware has returned it.
        _current.set(fields)
        response = self.get_response(request)
        response[HEADER] = request_id
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        if attempt_id := view_kwargs.get("attempt_id"):
            note_attempt(attempt_id)
        return None


def _request_finished(**kwargs) -> None:
    _current.set(None)


request_finished.connect(_request_finished, dispatch_uid="ledgerweb.request_context")


class RequestContextFilter(logging.Filter):
    """Adds the running request's fields to each record that does not carry its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_current.get() or {}).items():
            if getattr(record, name, None) in (None, ""):
                setattr(record, name, value)
        return True
