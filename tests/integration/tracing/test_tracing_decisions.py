"""Tracing at the evaluator, its steps called in process on a real store: an ack's intake
is a child of the span that earned it and its row keeps that context; a decision is a
child of the CM's send, linked to every ack it counted, and the messages it releases
(outcome notification, compensations) carry its context; a sphere's decision is linked
to its members' sends and its outcome notification carries its context
(docs/tracing.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from condmsg import Destination, tables
from condmsg.core.acks import AckKind
from condmsg.core.outcome import OUTCOME_TYPE, SPHERE_OUTCOME_TYPE
from condmsg.core.timeutil import utcnow
from evaluator.tracing import TracedBody
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import Clock, ack_body, stepped_evaluator
from tests.tracing_spans import recording

pytestmark = [pytest.mark.rabbitmq]

S = timedelta(seconds=1)
GRACE = timedelta(milliseconds=100)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    with recording(monkeypatch) as exporter:
        yield exporter


@pytest.fixture
def world(make_sender: Any, sqlite_url: str, unique_name: str) -> tuple[Any, Any, Clock, str]:
    clock = Clock(utcnow())
    sender = make_sender(
        sqlite_url, unique_name.replace(".", "-"), clock=clock, declare_queues=False
    )
    return sender, stepped_evaluator(sender, clock, ack_grace=GRACE), clock, f"{unique_name}.q"


def _receiver_span() -> tuple[str, str]:
    """A receiver's span, as its ack's traceparent names it: (traceparent, span id)."""
    span_id = os.urandom(8).hex()
    return f"00-{os.urandom(16).hex()}-{span_id}-01", span_id


def _ack(cm_id: str, queue: str, clock: Clock, kind: AckKind, traceparent: str) -> bytes:
    at = clock.at
    committed = at if kind is AckKind.COMMIT else None
    body = ack_body(cm_id, queue, at, receiver="rx", kind=kind, committed_at=committed)
    clock.at += 2 * GRACE
    return TracedBody.of(body, {"traceparent": traceparent})


def _rows(sender: Any, message_type: str) -> list[dict[str, Any]]:
    outbox = outbox_table()
    with sender.engine.connect() as conn:
        query = sa.select(outbox.c.headers).where(outbox.c.message_type == message_type)
        found = conn.scalars(query).all()
    return [json.loads(h) if isinstance(h, str) else h for h in found]


def _hex(span: Any) -> str:
    return f"{span.context.span_id:016x}"


def test_a_decision_joins_the_send_links_its_acks_and_marks_what_it_releases(
    spans: InMemorySpanExporter, world: tuple[Any, Any, Clock, str]
) -> None:
    sender, evaluator, clock, queue = world
    cm_id = sender.send(b"x", Destination(queue, process_within=60 * S), compensation=b"undo")
    traceparent, receiver_span = _receiver_span()
    # A READ ack: the destination can no longer be processed, the CM fails at once.
    assert evaluator.process_bodies([_ack(cm_id, queue, clock, AckKind.READ, traceparent)]) == 1
    finished = spans.get_finished_spans()
    (send,) = [s for s in finished if s.name.startswith("send ")]
    (intake,) = [s for s in finished if s.name.startswith("process ")]
    (decide,) = [s for s in finished if s.name.startswith("decide ")]
    assert intake.parent is not None and f"{intake.parent.span_id:016x}" == receiver_span
    assert decide.parent is not None and decide.parent.span_id == send.context.span_id
    assert [f"{link.context.span_id:016x}" for link in decide.links] == [receiver_span]
    assert decide.attributes is not None and decide.attributes["condmsg.verdict"] == "violated"
    assert list(decide.attributes["condmsg.reasons"])
    with sender.engine.connect() as conn:
        stored = conn.scalars(sa.select(tables.acks.c.traceparent)).all()
    assert stored == [traceparent]
    decided = f"00-{decide.context.trace_id:032x}-{_hex(decide)}"
    released = [*_rows(sender, OUTCOME_TYPE), *_rows(sender, "condmsg.compensation")]
    assert len(released) == 2
    assert all(h["traceparent"].startswith(decided) for h in released), released


def test_a_sphere_decision_links_its_members_sends(
    spans: InMemorySpanExporter, world: tuple[Any, Any, Clock, str]
) -> None:
    sender, evaluator, clock, queue = world
    sphere = sender.begin_sphere(timeout=60 * S)
    members = [sphere.send(b"m", Destination(queue, pickup_within=60 * S)) for _ in range(2)]
    sphere.commit()
    acks = [_ack(m, queue, clock, AckKind.READ, _receiver_span()[0]) for m in members]
    evaluator.process_bodies(acks)
    finished = spans.get_finished_spans()
    sends = {_hex(s) for s in finished if s.name.startswith("send ")}
    (decide,) = [s for s in finished if s.name.startswith("decide sphere ")]
    assert {f"{link.context.span_id:016x}" for link in decide.links} == sends
    assert decide.attributes is not None
    assert decide.attributes["condmsg.sphere_id"] == sphere.sphere_id
    assert decide.attributes["condmsg.verdict"] == "satisfied"
    (notice,) = _rows(sender, SPHERE_OUTCOME_TYPE)
    assert notice["traceparent"].split("-")[2] == _hex(decide)
