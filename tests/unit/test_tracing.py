"""condmsg.infra.tracing: nothing without an SDK (or without the API at all); with one, the
W3C context of the current span goes into headers, comes back out of them, and joins spans
across a message (docs/tracing.md); the relay's publish spans (outbox.publish_spans)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from condmsg.infra import tracing
from condmsg.runtime.logging_setup import JsonFormatter
from condmsg.runtime.ops_server import OpsServer
from outbox import publish_spans
from outbox.message import OutboxMessage, StoredMessage
from outbox.metrics import RelayMetrics
from tests.tracing_spans import recording

TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    with recording(monkeypatch) as exporter:
        yield exporter


def test_without_an_sdk_nothing_is_recorded_or_written() -> None:
    assert not tracing.active()
    assert tracing.current_headers() == {}
    headers = {"a": 1}
    assert tracing.with_current(headers) is headers
    with tracing.span(
        "anything", parent={tracing.TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    ) as span:
        assert span is None
    assert tracing.current_ids() is None
    assert tracing.links_to(["00-" + "1" * 32 + "-" + "2" * 16 + "-01"]) == []


def test_without_the_api_condmsg_imports_and_runs() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from condmsg.infra import tracing\n"
        "import condmsg.sending.sender, ackd.receiver, evaluator.service, outbox.relay\n"
        "assert not tracing.active() and tracing.current_headers() == {}\n"
        "with tracing.span('x') as s: assert s is None\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_current_context_travels_in_headers_and_parents_the_next_span(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("send", kind="producer") as sending:
        assert sending is not None
        headers = tracing.with_current({"app": "x"})
    assert headers is not None and headers["app"] == "x"
    traceparent = tracing.traceparent_of(headers)
    sent = sending.get_span_context()
    flags = int(sent.trace_flags)
    assert traceparent == f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{flags:02x}"
    # pika hands AMQP long strings over as bytes at times
    carried = {k: v.encode() if isinstance(v, str) else v for k, v in headers.items()}
    with tracing.span("receive", kind="consumer", parent=carried) as receiving:
        assert receiving is not None
    (_send, receive) = spans.get_finished_spans()
    assert receive.parent is not None and receive.parent.span_id == sent.span_id
    assert receive.context.trace_id == sent.trace_id
    assert receive.kind is trace.SpanKind.CONSUMER


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "01-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "A" * 32 + "-" + "b" * 16 + "-01",
        7,
    ],
)
def test_a_malformed_traceparent_is_ignored(value: object, spans: InMemorySpanExporter) -> None:
    assert tracing.traceparent_of({tracing.TRACEPARENT: value}) is None
    assert tracing.context_of({tracing.TRACEPARENT: value}) is None
    assert tracing.links_to([value if isinstance(value, str) else None]) == []


def test_links_name_each_span_once(spans: InMemorySpanExporter) -> None:
    one = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    two = "00-" + "1" * 32 + "-" + "3" * 16 + "-01"
    links = tracing.links_to([one, two, one, None])
    assert [f"{link.context.span_id:016x}" for link in links] == ["2" * 16, "3" * 16]


def _row(row_id: int, headers: dict[str, str] | None) -> StoredMessage:
    """An outbox row the relay claimed: one message to queue ``q``."""
    message = OutboxMessage(exchange="", routing_key="q", body=b"x", headers=headers)
    return StoredMessage(id=row_id, created_at=datetime.now(UTC), attempts=0, message=message)


def test_the_relay_records_a_publish_span_per_traced_row(spans: InMemorySpanExporter) -> None:
    with tracing.span("send") as sending:
        assert sending is not None
        headers = tracing.current_headers()
    rows = [_row(1, headers), _row(2, None)]
    publish_spans.record_publishes(rows, [(1, None), (2, None)], 0.0)
    publish = [s for s in spans.get_finished_spans() if s.name == "publish q"]
    assert len(publish) == 1
    assert publish[0].parent is not None
    assert publish[0].parent.span_id == sending.get_span_context().span_id
    assert publish[0].attributes is not None
    assert publish[0].attributes["messaging.operation.type"] == "send"
    assert publish[0].attributes["condmsg.outbox.row_id"] == 1


def test_json_log_lines_carry_the_current_trace(spans: InMemorySpanExporter) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    with tracing.span("work") as working:
        assert working is not None
        line = json.loads(JsonFormatter().format(record))
    context = working.get_span_context()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"


def test_a_relay_batch_gets_an_exemplar_that_openmetrics_scrapes_show(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("send") as sending:
        assert sending is not None
        headers = tracing.current_headers()
    rows = [_row(1, None), _row(2, headers)]
    exemplar = publish_spans.exemplar_of(rows)
    context = sending.get_span_context()
    assert exemplar == {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
    }
    registry = CollectorRegistry()
    RelayMetrics(registry, table="outbox").batch_confirm.observe(0.25, exemplar)
    server = OpsServer(registry, port=0, live=lambda: None, ready=lambda: None, host="127.0.0.1")
    try:
        _status, kind, body = server.answer(
            "/metrics", "application/openmetrics-text; version=1.0.0"
        )
        assert kind.startswith("application/openmetrics-text")
        assert f'trace_id="{context.trace_id:032x}"' in body.decode()
        _status, kind, body = server.answer("/metrics")
        assert kind.startswith("text/plain") and b"trace_id" not in body
    finally:
        server.stop()


def test_without_an_sdk_there_is_no_exemplar() -> None:
    assert publish_spans.exemplar_of([_row(1, {tracing.TRACEPARENT: TRACEPARENT})]) is None
