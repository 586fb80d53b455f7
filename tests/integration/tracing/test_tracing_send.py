"""Tracing at the sender, over the real RabbitMQ and a real store: a send's span gives its
copies (in their outbox row) and its CM row the W3C trace context, under the
application's span; a sphere's block is a span of its own, its members' sends are its
children and its participants events of it (docs/tracing.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from condmsg import Destination, tables
from condmsg.infra import tracing
from outbox.table import outbox_table
from tests.tracing_spans import recording

pytestmark = [pytest.mark.rabbitmq]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    with recording(monkeypatch) as exporter:
        yield exporter


def _traceparent(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_a_send_stores_its_span_context_with_its_copies_and_its_cm(
    spans: InMemorySpanExporter, make_sender: Any, sqlite_url: str, unique_name: str
) -> None:
    sender = make_sender(sqlite_url, unique_name.replace(".", "-"))
    condition = Destination(f"{unique_name}.q", process_within=timedelta(minutes=5))
    with tracing.span("request") as request:
        cm_id = sender.send(b"x", condition, headers={"app": "kept"})
    (send,) = [s for s in spans.get_finished_spans() if s.name.startswith("send ")]
    assert request is not None and send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.attributes is not None and send.attributes["condmsg.cm_id"] == cm_id
    assert send.attributes["messaging.operation.type"] == "create"
    with sender.engine.connect() as conn:
        (headers,) = conn.execute(sa.select(outbox_table().c.headers)).scalars()
        stored = conn.execute(sa.select(tables.cms.c.traceparent)).scalar_one()
    headers = json.loads(headers) if isinstance(headers, str) else headers
    assert headers["traceparent"] == stored == _traceparent(send)
    assert headers["app"] == "kept"


def test_without_an_sdk_a_send_stores_no_trace_context(
    make_sender: Any, sqlite_url: str, unique_name: str
) -> None:
    sender = make_sender(sqlite_url, unique_name.replace(".", "-"))
    sender.send(b"x", Destination(f"{unique_name}.q", pickup_within=timedelta(minutes=5)))
    with sender.engine.connect() as conn:
        (headers,) = conn.execute(sa.select(outbox_table().c.headers)).scalars()
        assert conn.execute(sa.select(tables.cms.c.traceparent)).scalar_one() is None
    headers = json.loads(headers) if isinstance(headers, str) else headers
    assert "traceparent" not in headers


def test_a_sphere_is_a_span_with_its_members_and_participants(
    spans: InMemorySpanExporter, make_sender: Any, sqlite_url: str, unique_name: str
) -> None:
    sender = make_sender(sqlite_url, unique_name.replace(".", "-"))
    sender.register_handler("undo", lambda session, **args: None)
    condition = Destination(f"{unique_name}.q", pickup_within=timedelta(minutes=5))
    with sender.sphere(timeout=60) as sphere:
        members = [sphere.send(b"a", condition), sphere.send(b"b", condition)]
        sphere.on_failure("undo")
    (sphere_span,) = [s for s in spans.get_finished_spans() if s.name.startswith("sphere ")]
    sends = [s for s in spans.get_finished_spans() if s.name.startswith("send ")]
    assert sorted(s.attributes["condmsg.cm_id"] for s in sends if s.attributes) == sorted(members)
    assert all(
        s.parent is not None and s.parent.span_id == sphere_span.context.span_id for s in sends
    )
    assert sphere_span.attributes is not None
    assert sphere_span.attributes["condmsg.sphere_id"] == sphere.sphere_id
    assert sphere_span.attributes["condmsg.sphere.state"] == "committed"
    assert [e.attributes for e in sphere_span.events] == [
        {"condmsg.participant.kind": "handler", "condmsg.participant.id": "h1"}
    ]
