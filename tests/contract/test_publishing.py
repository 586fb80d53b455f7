"""The publishing seam: frames encoded by the outbox (the fast path) and pika's
``basic_publish`` (the plain path) put the same messages on the wire, against the real
RabbitMQ; and which of them ``auto`` takes on which pika.

Each implementation publishes the same rows through a real :class:`Publisher`; a real
consumer must see byte-identical bodies and equal properties and headers, and the broker's
answers (confirms, returns, refusals) must resolve the batches the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg.infra.fastpaths import gate
from outbox import OutboxMessage, Relay, RelayConfig, StoredMessage
from outbox.config import PUBLISHING_CHOICES
from outbox.publish_confirms import BatchResult, Publisher, publishing_for
from outbox.publish_frames import Connection, FramePublishing
from outbox.publish_pika import COPY_HEADER, ROW_ID_HEADER, PikaPublishing, without_ours
from tests.integration.outbox_helpers import Collector, declare_queues, delete_queues
from tests.waiting import wait_for

#: The fast path and the plain one, forced by name (``auto`` picks one of them).
IMPLEMENTATIONS = ["frames", "pika"]
FRAME_MAX = 131072  # RabbitMQ's default, which the publisher's connection negotiates
PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
)
#: A header of every AMQP field type the outbox carries (floats apart: see below).
EVERY_TYPE = {
    "text": "é ünïcode",
    "empty": "",
    "small": 7,
    "negative": -5,
    "int32_edge": 2**31,
    "big": -(2**40),
    "int64_min": -(2**63),
    "yes": True,
    "no": False,
    "nothing": None,
    "list": [1, "a", None, True, {"x": False}, []],
    "table": {"k": [None, "v"], "inner": {"deep": 2**33}, "empty": {}},
}


def stored(row_id: int, message: OutboxMessage, *copies: dict[str, Any]) -> StoredMessage:
    return StoredMessage(
        id=row_id, created_at=datetime.now(UTC), attempts=0, message=message, copies=copies
    )


def message(queue: str, body: bytes = b"body", **fields: Any) -> OutboxMessage:
    return OutboxMessage(exchange="", routing_key=queue, body=body, **fields)


@pytest.fixture
def queues(amqp_url: str, unique_name: str) -> Iterator[tuple[str, str]]:
    names = (f"{unique_name}.a", f"{unique_name}.b")
    declare_queues(amqp_url, names)
    yield names
    delete_queues(amqp_url, names)


def publish(amqp_url: str, name: str, *batches: list[StoredMessage]) -> list[BatchResult]:
    """Publish ``batches`` back to back on one publisher of the implementation ``name``."""
    publisher = Publisher(amqp_url, publishing=publishing_for(name)).start()
    try:
        pending = [publisher.submit(rows) for rows in batches]
        assert all(batch.wait(30) for batch in pending)
        return [batch.result for batch in pending]
    finally:
        publisher.close()


def published_and_seen(
    amqp_url: str, name: str, queues: tuple[str, ...], batches: list[list[StoredMessage]]
) -> tuple[list[BatchResult], dict[str, list[tuple[int, dict[str, Any], bytes]]]]:
    """The batches' results and what a consumer of ``queues`` received, per queue in
    arrival order: (row id, properties, body)."""
    collector = Collector(amqp_url, queues)
    try:
        results = publish(amqp_url, name, *batches)
        keys = {key for result in results for key in result.published}
        routed = {
            (row.id, n)
            for rows in batches
            for row in rows
            for n, m in row.expand()
            if m.routing_key in queues
        }
        expected = len(keys & routed)
        wait_for(lambda: len(collector.ids()) >= expected, 30, f"{expected} deliveries")
        seen = {
            queue: [(row_id, properties(props), body) for row_id, props, body in deliveries]
            for queue, deliveries in collector.deliveries.items()
        }
    finally:
        collector.close()
    return results, seen


def properties(props: Any) -> dict[str, Any]:
    return {name: getattr(props, name) for name in PROPERTY_NAMES}


def expected_properties(row_id: int, copy: int | None, m: OutboxMessage) -> dict[str, Any]:
    headers = without_ours(m.headers) | {ROW_ID_HEADER: row_id}
    if copy is not None:
        headers[COPY_HEADER] = copy
    return {
        "content_type": m.content_type,
        "content_encoding": m.content_encoding,
        "headers": headers,
        "delivery_mode": 2 if m.persistent else 1,
        "priority": m.priority,
        "correlation_id": m.correlation_id,
        "reply_to": m.reply_to,
        "expiration": None if m.expiration_ms is None else str(m.expiration_ms),
        "message_id": m.message_id,
        "type": m.message_type,
    }


def rows_to_publish(a: str, b: str, unique_name: str) -> list[StoredMessage]:
    """Plain rows with every property, a fan-out row, large and empty bodies, and rows the
    broker or the encoder refuses, interleaved so that refusals sit between delivery tags."""
    shared = {"cm": "c-1", "dest": a, COPY_HEADER: 99}
    return [
        stored(
            1,
            message(
                a,
                bytes(range(256)),
                message_id="m-1",
                correlation_id="c-1",
                reply_to="replies",
                content_type="application/json",
                content_encoding="gzip",
                message_type="notice",
                headers={**EVERY_TYPE, ROW_ID_HEADER: "not ours"},
                priority=9,
                expiration_ms=60000,
                persistent=False,
                mandatory=False,
            ),
        ),
        stored(2, message(b, b"")),
        stored(3, message(f"{unique_name}.none", b"mandatory, unroutable")),
        stored(4, message(a, bytes(range(251)) * 1600 + b"tail")),  # > 3 * frame_max
        stored(5, message(a, headers={"k" * 256: 1})),
        stored(
            6,
            message(a, b"shared body", message_id="m-6", headers=shared),
            {"n": 0},
            {"n": 1, "routing_key": b, "priority": 4, "headers": {"tok": "b"}},
            {"n": 2, "message_id": "m-6.2", "headers": {"dest": b, "tok": "c"}},
        ),
        stored(7, message(f"{unique_name}.none", b"not mandatory", mandatory=False)),
        stored(8, message(a, headers={"l": [1, [2, 2**64]]})),
        stored(9, OutboxMessage(exchange=f"{unique_name}.ex", routing_key=a, body=b"404")),
        stored(
            10,
            message(a, headers={}),
            {"n": 0, "headers": {"fine": 1}},
            {"n": 1, "headers": {"bad": 2**70}},
        ),
        stored(11, message(b, b"last", headers={"n": 11})),
    ]


@pytest.mark.rabbitmq
def test_both_put_the_same_messages_on_the_wire(
    amqp_url: str, queues: tuple[str, str], unique_name: str
) -> None:
    rows = rows_to_publish(*queues, unique_name)
    batches = [rows[:5], rows[5:]]  # delivery tags run on across batches
    outcomes = {
        name: published_and_seen(amqp_url, name, queues, batches) for name in IMPLEMENTATIONS
    }
    frames_results, frames_seen = outcomes["frames"]
    pika_results, pika_seen = outcomes["pika"]
    assert pika_seen == frames_seen  # byte-identical bodies, equal properties, same order
    for frames_result, pika_result in zip(frames_results, pika_results, strict=True):
        assert sorted(pika_result.published) == sorted(frames_result.published)
        assert pika_result.refused == frames_result.refused
        for result in (frames_result, pika_result):
            assert (result.nacked, result.error) == ({}, None)
    refused = {key: reason for result in frames_results for key, reason in result.refused.items()}
    assert set(refused) == {(3, None), (5, None), (8, None), (9, None), (10, 0), (10, 1)}
    assert refused[(3, None)].startswith("unroutable: 312 NO_ROUTE")
    unencodable = "cannot be encoded as AMQP: "
    assert refused[(5, None)] == f"{unencodable}{'k' * 40!r}... is longer than 255 bytes"
    assert refused[(8, None)] == f"{unencodable}header value {2**64} does not fit 64 bits"
    assert "does not exist (404 NOT_FOUND)" in refused[(9, None)]
    # One copy that cannot be encoded keeps the whole row back.
    too_big = f"{unencodable}header value {2**70} does not fit 64 bits"
    assert refused[(10, 0)] == refused[(10, 1)] == too_big
    # What arrived is what the rows hold, copy by copy.
    expected: dict[str, list[tuple[int, dict[str, Any], bytes]]] = {q: [] for q in queues}
    for row in rows:
        for n, m in row.expand():
            if m.routing_key in expected and (row.id, n) not in refused:
                expected[m.routing_key].append((row.id, expected_properties(row.id, n, m), m.body))
    assert frames_seen == expected


@pytest.mark.rabbitmq
def test_floats_travel_only_as_frames(amqp_url: str, queues: tuple[str, str]) -> None:
    """pika has no encoder for floats: under pika a row with a float header is refused,
    where the frames send it as an AMQP double."""
    row = stored(1, message(queues[0], headers={"ratio": 0.5, "n": 1}))
    [frames_result] = publish(amqp_url, "frames", [row])
    [pika_result] = publish(amqp_url, "pika", [row])
    assert frames_result.published == [(1, None)]
    assert pika_result.refused == {
        (1, None): "cannot be encoded as AMQP: cannot encode a float as an AMQP field value"
    }


@pytest.mark.rabbitmq
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_the_relay_publishes_with_the_configured_implementation(
    name: str, amqp_url: str, sqlite_url: str, queues: tuple[str, str], unique_name: str
) -> None:
    engine = sa.create_engine(sqlite_url)
    outbox.create_tables(engine)
    with Session(engine) as session, session.begin():
        ids = outbox.enqueue_many(session, [message(queues[i % 2], b"%d" % i) for i in range(50)])
        outbox.enqueue(session, exchange="", routing_key=f"{unique_name}.none", body=b"x")
    collector = Collector(amqp_url, queues)
    try:
        relay = Relay(engine, RelayConfig(amqp_url=amqp_url, batch_size=16, publishing=name))
        stats = relay.run_until_idle(30)
        collector.wait_for(ids)
        assert sorted(collector.ids()) == ids
        assert (stats.published, stats.failed) == (50, 1)
    finally:
        collector.close()
        engine.dispose()


def test_the_relay_config_names_a_publishing() -> None:
    assert ("auto", *IMPLEMENTATIONS) == PUBLISHING_CHOICES
    assert RelayConfig.from_env({}).publishing == "auto"
    env = {"CONDMSG_RELAY_PUBLISHING": "pika"}
    assert RelayConfig.from_env(env).publishing == "pika"
    assert RelayConfig.from_env(env, publishing="frames").publishing == "frames"
    with pytest.raises(ValueError, match="CONDMSG_RELAY_PUBLISHING must be one of auto, frames"):
        RelayConfig.from_env({"CONDMSG_RELAY_PUBLISHING": "fast"})
    with pytest.raises(ValueError, match="publishing must be one of"):
        RelayConfig(amqp_url="amqp://x", publishing="fast")


@pytest.fixture
def untold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each choice is logged once per process: this test sees its own."""
    monkeypatch.setattr(gate, "_told", set())


@pytest.mark.usefixtures("untold")
@pytest.mark.parametrize(
    ("version", "frames"), [("1.3.2", True), ("1.4.4", True), ("1.3.1", False), ("1.5.0", False)]
)
def test_auto_takes_the_frames_only_on_a_tested_pika(
    version: str, frames: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("pika.__version__", version)
    caplog.set_level("INFO", logger="outbox.fast_paths")
    chosen = publishing_for("auto")
    assert isinstance(chosen, FramePublishing if frames else PikaPublishing)
    path = "fast path" if frames else "plain path"
    assert [r.getMessage() for r in caplog.records] == [
        f"outbox relay publishing: {path} (pika {version})"
        if frames
        else f"outbox relay publishing: plain path (pika {version} is not a release it was "
        "tested with (1.3.2 to before 1.5))"
    ]
    publishing_for("auto")
    assert len(caplog.records) == 1  # once per process


@pytest.mark.usefixtures("untold")
def test_a_forced_path_wins_and_the_frames_need_their_hook(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("pika.__version__", "1.5.0")
    assert isinstance(publishing_for("frames"), FramePublishing)  # trying a new release
    assert "forced although pika 1.5.0 is not a release" in caplog.text
    assert isinstance(publishing_for("pika"), PikaPublishing)
    monkeypatch.setattr("pika.__version__", "1.4.4")
    monkeypatch.delattr(Connection, "_adapter_emit_data")
    assert isinstance(publishing_for("auto"), PikaPublishing)
    with pytest.raises(ValueError, match=r"lacks Connection\._adapter_emit_data"):
        publishing_for("frames")
    with pytest.raises(ValueError, match=r"lacks Connection\._adapter_emit_data"):
        Relay(sa.create_engine("sqlite://"), RelayConfig(amqp_url="amqp://x", publishing="frames"))
