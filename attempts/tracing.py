"""OpenTelemetry for the ledger: the W3C ``traceparent`` an agent sends with its intent, and
spans of the ledger's own steps (intent, claim, confirm, lookup, settle).

The ``traceparent`` (https://www.w3.org/TR/trace-context/) is checked here and kept on the
attempt, so an attempt is found from a trace (``GET /api/v1/attempts?trace_id=``) and a trace from
an attempt (its page links ``LEDGERWEB_TRACE_URL``). Spans are exported over OTLP/HTTP only when
``LEDGERWEB_OTLP_ENDPOINT`` is set; otherwise ``span()`` hands back one shared no-op context
manager and nothing of OpenTelemetry is ever imported. The exporter is set up in each process at
its first span (after gunicorn forks), batched on a background thread, so a slow collector never
holds up a tool call.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_NO_SPAN = contextlib.nullcontext()


class InvalidTraceparent(ValueError):
    """A ``traceparent`` header that is not W3C Trace Context."""


class TraceParent(NamedTuple):
    trace_id: str
    span_id: str
    flags: str

    @property
    def header(self) -> str:
        """The version-00 form the ledger stores and sends on."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def parse_traceparent(value: str) -> TraceParent:
    """The parts of a ``traceparent`` header, or InvalidTraceparent saying what is wrong.

    Lowercase hex only; version ``ff`` and all-zero ids are invalid; version ``00`` has exactly
    four fields, a later version may carry more after them (ignored, as the spec says)."""
    text = value.strip()
    match = _TRACEPARENT.match(text)
    if not match:
        raise InvalidTraceparent(
            "traceparent must be W3C Trace Context: version-trace_id-parent_id-flags in "
            "lowercase hex (2-32-16-2 digits), e.g. "
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        )
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff":
        raise InvalidTraceparent("traceparent version ff is invalid")
    if version == "00" and rest:
        raise InvalidTraceparent("a version 00 traceparent has exactly four fields")
    if trace_id == "0" * 32:
        raise InvalidTraceparent("traceparent trace_id must not be all zeros")
    if span_id == "0" * 16:
        raise InvalidTraceparent("traceparent parent_id must not be all zeros")
    return TraceParent(trace_id, span_id, flags)


def trace_url(trace_id: str) -> str:
    """The team's tracing UI for one trace, or "" when none is configured."""
    template = settings.TRACING["TRACE_URL"]
    return template.replace("{trace_id}", trace_id) if template and trace_id else ""


# ---------------------------------------------------------------------------------------------
# Spans (only with LEDGERWEB_OTLP_ENDPOINT)

_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None


def _headers(raw: str) -> dict[str, str]:
    headers = {}
    for item in raw.split(","):
        name, sep, value = item.partition("=")
        if item.strip() and (not sep or not name.strip()):
            raise ImproperlyConfigured("LEDGERWEB_OTLP_HEADERS must be name=value,name=value")
        if sep:
            headers[name.strip()] = value.strip()
    return headers


def tracer() -> Any:
    """This process's tracer, set up at first use (None when tracing is off)."""
    global _tracer, _provider
    endpoint = settings.TRACING["OTLP_ENDPOINT"]
    if not endpoint:
        return None
    if _tracer is not None:
        return _tracer
    with _lock:
        if _tracer is None:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
                from opentelemetry.sdk.resources import Resource
                from opentelemetry.sdk.trace import TracerProvider
                from opentelemetry.sdk.trace.export import BatchSpanProcessor
            except ImportError:
                raise ImproperlyConfigured(
                    "LEDGERWEB_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
                    "pip install 'ledgerweb[tracing]'"
                ) from None
            provider = TracerProvider(
                resource=Resource.create({"service.name": settings.TRACING["SERVICE_NAME"]})
            )
            exporter = OTLPSpanExporter(
                endpoint=f"{endpoint}/v1/traces",
                headers=_headers(settings.TRACING["OTLP_HEADERS"]),
                timeout=10,
            )
            provider.add_span_processor(BatchSpanProcessor(exporter))
            _provider, _tracer = provider, provider.get_tracer("ledgerweb")
    return _tracer


def flush(timeout_millis: int = 10000) -> bool:
    """Export every finished span now (tests; a worker before it exits)."""
    return _provider.force_flush(timeout_millis) if _provider is not None else True


def reset() -> None:
    """Forget this process's tracer (tests that change the endpoint)."""
    global _tracer, _provider
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _tracer = _provider = None


def span(name: str, attempt: Any = None, *, traceparent: str = "", **attributes: Any):
    """A span named ``name`` around a ledger step, in the trace the attempt's agent sent (or the
    one ``traceparent`` names); a shared no-op when tracing is off. Yields the span (or None)."""
    if not settings.TRACING["OTLP_ENDPOINT"]:
        return _NO_SPAN
    return _recording(name, attempt, traceparent, attributes)


@contextlib.contextmanager
def _recording(name: str, attempt: Any, traceparent: str, attributes: dict[str, Any]):
    from opentelemetry import trace

    parent = traceparent or (getattr(attempt, "traceparent", "") if attempt is not None else "")
    context = None
    if parent:
        part = parse_traceparent(parent)
        context = trace.set_span_in_context(
            trace.NonRecordingSpan(
                trace.SpanContext(
                    trace_id=int(part.trace_id, 16),
                    span_id=int(part.span_id, 16),
                    is_remote=True,
                    trace_flags=trace.TraceFlags(int(part.flags, 16)),
                )
            )
        )
    with tracer().start_as_current_span(name, context=context, kind=trace.SpanKind.INTERNAL) as s:
        if attempt is not None:
            describe(s, attempt)
        for key, value in attributes.items():
            if value is not None:
                s.set_attribute(f"ledger.{key}", value)
        yield s


def describe(s: Any, attempt: Any) -> None:
    """The attempt's identity on a span (after the step: its state then)."""
    if s is None:
        return
    s.set_attribute("ledger.attempt_id", attempt.attempt_id)
    s.set_attribute("ledger.tenant", attempt.tenant_id)
    s.set_attribute("ledger.tool", attempt.tool_name)
    s.set_attribute("ledger.state", attempt.state)
