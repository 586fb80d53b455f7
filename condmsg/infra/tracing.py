"""Trace context that travels with outbox rows, and spans that cost nothing when unused.

OpenTelemetry is optional (the ``condmsg[otel]`` extra installs its API only): without the
API, or with the API but no SDK's tracer provider installed, :func:`active` is false and
every helper here returns at once, so the send, relay and receive paths pay one function
call and one ``isinstance`` per use, not a span. With an SDK installed, the W3C trace
context (``traceparent``, ``tracestate``) of the span current when a message is made is
written into its AMQP headers, which the outbox stores as JSON with the row: the relay,
another process, publishes it as it was written, so a trace stays whole across the
outbox.

The context is always written in the W3C format, whatever propagator the application
configured globally: it is part of condmsg's wire protocol (docs/protocol.md), which
other receivers read.

This module lives in the shared infrastructure because every layer that makes messages
(the sender, the receiver, the evaluator) and the relay that publishes them use it; what
each makes of a span stays beside its use (the relay's publish spans:
:mod:`outbox.publish_spans`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the condmsg[otel] extra is not installed: tracing is off
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanContext, Tracer

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: Version 00 of W3C ``traceparent``: version-traceid-parentid-flags, lower-case hex. The
#: only form condmsg stores (a column of 55 characters); other values are ignored.
_TRACEPARENT_00 = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
#: W3C caps ``tracestate`` at 32 list members; 512 characters is what its propagators
#: keep (a longer one is dropped, never cut).
MAX_TRACESTATE = 512

# The attribute names of OpenTelemetry's messaging semantic conventions that condmsg sets.
SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
CONVERSATION_ID = "messaging.message.conversation_id"
BATCH_COUNT = "messaging.batch.message_count"
BODY_SIZE = "messaging.message.body.size"
RABBITMQ = "rabbitmq"
ROUTING_KEY = "messaging.rabbitmq.destination.routing_key"

_PROPAGATOR = TraceContextTextMapPropagator() if _trace is not None else None
_TRACER_NAME = "condmsg"
_KINDS = ("internal", "producer", "consumer", "client", "server")
# Once an SDK's provider is installed it stays (OpenTelemetry sets the global one once).
_seen_sdk = False


def active() -> bool:
    """True when spans are recorded: the API is installed and an SDK's tracer provider is
    set (the API's own proxy provider, which every process has, records nothing)."""
    global _seen_sdk
    if _seen_sdk:
        return True
    if _trace is None:
        return False  # type: ignore[unreachable,unused-ignore]
    provider = _trace.get_tracer_provider()
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        return False
    _seen_sdk = True
    return True


def current_headers() -> dict[str, str]:
    """The W3C headers of the current span's context, or ``{}`` (tracing off, or no
    current span)."""
    if not active():
        return {}
    carrier: dict[str, str] = {}
    assert _PROPAGATOR is not None
    _PROPAGATOR.inject(carrier)
    return carrier


def with_current(headers: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``headers`` with the current trace context added (the same object when there is
    none to add)."""
    context = current_headers()
    if not context:
        return headers
    return {**(headers or {}), **context}


def traceparent_of(headers: Mapping[str, Any] | None) -> str | None:
    """A well-formed version-00 ``traceparent`` in ``headers`` (str or UTF-8 bytes, as
    pika hands AMQP long strings over), else None."""
    if not headers:
        return None
    value = headers.get(TRACEPARENT)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str) and _TRACEPARENT_00.fullmatch(value):
        return value
    return None


def carried(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """The trace context ``headers`` carry, as headers to pass on: a well-formed
    ``traceparent`` and, with it, a ``tracestate`` of at most :data:`MAX_TRACESTATE`
    characters; ``{}`` without a valid ``traceparent``. What a receiver that records no
    span of its own puts in its acks (a W3C intermediary passes the context on)."""
    traceparent = traceparent_of(headers)
    if traceparent is None:
        return {}
    assert headers is not None
    found = {TRACEPARENT: traceparent}
    state = headers.get(TRACESTATE)
    if isinstance(state, bytes):
        state = state.decode("utf-8", "replace")
    if isinstance(state, str) and 0 < len(state) <= MAX_TRACESTATE:
        found[TRACESTATE] = state
    return found


def context_of(headers: Mapping[str, Any] | None) -> Context | None:
    """The remote context carried by ``headers`` (None: tracing off, or none carried)."""
    if not active():
        return None  # before any parsing: nothing to pay with tracing off
    found = carried(headers)
    if not found:
        return None
    assert _PROPAGATOR is not None
    return _PROPAGATOR.extract(found)


def span_context_of(traceparent: str | None) -> SpanContext | None:
    """The span context a stored ``traceparent`` names (for links), or None."""
    context = context_of({TRACEPARENT: traceparent}) if traceparent else None
    if context is None:
        return None
    assert _trace is not None
    span_context = _trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def links_to(traceparents: Iterable[str | None]) -> list[Link]:
    """Links to the spans that ``traceparents`` name (invalid and missing ones skipped,
    each span once)."""
    if not active():
        return []
    assert _trace is not None
    found: dict[str, Link] = {}
    for traceparent in traceparents:
        if traceparent and traceparent not in found:
            span_context = span_context_of(traceparent)
            if span_context is not None:
                found[traceparent] = _trace.Link(span_context)
    return list(found.values())


@contextmanager
def span(
    name: str,
    *,
    kind: str = "internal",
    parent: Mapping[str, Any] | None = None,
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[Link] = (),
    start_ns: int | None = None,
) -> Iterator[Span | None]:
    """A span named ``name``, current inside the block; None when tracing is off.

    ``kind`` is one of internal, producer, consumer, client, server. ``parent`` holds the
    headers of a message whose context is the span's parent (else the current span is).
    ``start_ns`` (nanoseconds since the epoch) backdates the start.
    """
    if not active():
        yield None
        return
    assert _trace is not None
    with _tracer().start_as_current_span(
        name,
        context=context_of(parent) if parent is not None else None,
        kind=_trace.SpanKind[kind.upper()] if kind in _KINDS else _trace.SpanKind.INTERNAL,
        attributes=dict(attributes or {}),
        links=links,
        start_time=start_ns,
    ) as current:
        yield current


class OpenSpan:
    """A span begun by one call and ended by another (a context manager's ``__enter__``
    and ``__exit__``), current in between; nothing without tracing."""

    def __init__(self, name: str, **options: Any) -> None:
        self._stack = ExitStack()
        self.span: Span | None = self._stack.enter_context(span(name, **options))

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        if self.span is not None:
            self.span.add_event(name, dict(attributes))

    def end(self, attributes: Mapping[str, Any] | None = None) -> None:
        if self.span is not None and attributes:
            self.span.set_attributes(dict(attributes))
        self._stack.close()


@functools.cache
def _tracer() -> Tracer:
    """condmsg's tracer, from the SDK's provider (asked once: :func:`active` is true only
    once that provider is installed, and it is never replaced)."""
    assert _trace is not None
    return _trace.get_tracer(_TRACER_NAME)


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span as hex, for log lines; None without."""
    if not active():
        return None
    assert _trace is not None
    span_context = _trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"
