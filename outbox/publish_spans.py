"""The relay's publish spans: one ``send`` span per published row that carries a trace
context, a child of the span that made the row, and the exemplar that ties a batch's
confirm latency to a trace. Nothing without tracing (:func:`condmsg.infra.tracing.active`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from condmsg.infra.tracing import (
    BATCH_COUNT,
    BODY_SIZE,
    CONVERSATION_ID,
    DESTINATION,
    MESSAGE_ID,
    OPERATION_NAME,
    OPERATION_TYPE,
    RABBITMQ,
    ROUTING_KEY,
    SYSTEM,
    active,
    span,
    traceparent_of,
)
from outbox.message import StoredMessage
from outbox.publish_pika import MessageKey


def record_publishes(
    rows: Sequence[StoredMessage], published: Collection[MessageKey], submitted_at: float
) -> None:
    """One ``send`` span per row RabbitMQ confirmed (``published``: the batch's confirmed
    messages) that carries a trace context, from the batch's submission (``submitted_at``,
    ``time.monotonic()``) to its confirmation: the relay's publish, a child of the span
    that made the row. A refused, parked or nacked row has no publish span."""
    if not active() or not published:
        return
    confirmed = {row_id for row_id, _copy in published}
    submitted_ns = _epoch_ns_of_monotonic(submitted_at)
    for row in rows:
        headers = row.message.headers
        if row.id not in confirmed or traceparent_of(headers) is None:
            continue
        message = row.message
        attributes: dict[str, Any] = {
            SYSTEM: RABBITMQ,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "publish",
            DESTINATION: message.exchange or message.routing_key,
            ROUTING_KEY: message.routing_key,
            BODY_SIZE: len(message.body),
            "condmsg.outbox.row_id": row.id,
        }
        if message.correlation_id:
            attributes[CONVERSATION_ID] = message.correlation_id
        name = f"publish {attributes[DESTINATION]}"
        if row.copies:  # a fan-out row: one message per copy, each to its own queue
            keys = sorted({str(c.get("routing_key", message.routing_key)) for c in row.copies})
            attributes[BATCH_COUNT] = len(row.copies)
            attributes["condmsg.routing_keys"] = keys
            name = "publish fan-out"
        elif message.message_id:
            attributes[MESSAGE_ID] = message.message_id
        with span(
            name,
            kind="producer",
            parent=headers,
            attributes=attributes,
            start_ns=submitted_ns,
        ):
            pass


def exemplar_of(rows: Sequence[StoredMessage]) -> dict[str, str] | None:
    """A Prometheus exemplar for a measurement of ``rows`` (a relay batch): the trace and
    span ids of the first row made in a traced span; None without tracing or without one."""
    if not active():
        return None
    for row in rows:
        traceparent = traceparent_of(row.message.headers)
        if traceparent is not None:
            _version, trace_id, span_id, _flags = traceparent.split("-")
            return {"trace_id": trace_id, "span_id": span_id}
    return None


def _epoch_ns_of_monotonic(monotonic_s: float) -> int:
    """The wall-clock instant (ns since the epoch) of an earlier ``time.monotonic()``."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)
