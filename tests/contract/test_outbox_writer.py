"""Contract of :class:`outbox.enqueueing.OutboxWriter`, run against every adapter.

Every row an adapter writes is read back with SQLAlchemy and compared, column by column
(all but ``id`` and ``created_at``), with :func:`outbox.enqueueing.row_values` of the same
message: the one definition of an outbox row, so every adapter writes what the others do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxMessage, OutboxTypeError, OutboxValueError
from outbox import enqueueing as adapters
from outbox.enqueueing import OutboxWriter, Row, TemplateBatch, row_values

pytestmark = pytest.mark.postgres

TABLE = outbox.DEFAULT_TABLE_NAME
#: Columns a freshly written row has that row_values does not set.
UNSET = {"available_at": None, "last_error": None, "failed_at": None}


@pytest.fixture
def engine(adapter_backend: tuple[str, bool]) -> Iterator[sa.Engine]:
    eng = sa.create_engine(adapter_backend[0])
    outbox.create_tables(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def writer(adapter_backend: tuple[str, bool]) -> OutboxWriter:
    if adapter_backend[1]:
        return adapters.PsycopgOutboxWriter()
    return adapters.SqlAlchemyOutboxWriter()


def stored(engine: sa.Engine) -> list[dict[str, Any]]:
    """Every row of the table in id order, without ``id`` and ``created_at``."""
    table = outbox.outbox_table(TABLE)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
    return [{k: v for k, v in row.items() if k not in ("id", "created_at")} for row in rows]


def expected(rows: Sequence[Row]) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    values = [row_values(m, now, c) | UNSET for m, c in rows]
    return [{k: v for k, v in row.items() if k != "created_at"} for row in values]


def various(n: int) -> list[OutboxMessage]:
    """Messages that differ in every property, with NULLs among the values."""
    return [
        OutboxMessage(
            exchange="" if i % 2 else "ex",
            routing_key=f"rk{i}",
            body=bytes([i, 0, 255]) * (i + 1),
            message_id=f"m{i}" if i != 1 else None,
            correlation_id=f"c{i}",
            reply_to=None if i == 2 else f"r{i}",
            content_type="application/json" if i % 2 else None,
            content_encoding="utf-8" if i == 0 else None,
            message_type=f"t{i}",
            headers=None if i == 1 else {"n": i, "nested": {"l": [1, "x", None]}, "f": i == 0},
            priority=i if i < 2 else None,
            expiration_ms=1000 * i or None,
            persistent=i != 1,
            mandatory=i != 2,
        )
        for i in range(n)
    ]


def shared(n: int) -> list[OutboxMessage]:
    """Messages that share every property but their bodies and message ids."""
    base = OutboxMessage(
        exchange="",
        priority=1,
        routing_key="q",
        headers={"same": "yes"},
        body=b"",
        expiration_ms=5000,
        correlation_id="c",
        persistent=False,
        reply_to="acks",
        content_type="text/plain",
    )
    return [replace(base, body=f"body {i}".encode(), message_id=f"m{i}") for i in range(n)]


def insert(engine: sa.Engine, writer: OutboxWriter, rows: Sequence[Row]) -> None:
    with Session(engine) as s, s.begin():
        writer.insert(s, rows, TABLE)


@pytest.mark.parametrize(
    "messages", [various(4), shared(3), various(2)[1:]], ids=["arrays", "shared", "one"]
)
def test_plain_rows_hold_exactly_their_messages(
    engine: sa.Engine, writer: OutboxWriter, messages: list[OutboxMessage]
) -> None:
    rows: list[Row] = [(m, None) for m in messages]
    insert(engine, writer, rows)
    assert stored(engine) == expected(rows)


def test_a_shared_value_and_a_varying_one_in_the_same_column(
    engine: sa.Engine, writer: OutboxWriter
) -> None:
    """A column shared within one batch and varying in the next reads back the same."""
    insert(engine, writer, [(m, None) for m in shared(2)])
    insert(engine, writer, [(m, None) for m in various(3)])
    insert(engine, writer, [(shared(1)[0], None)])
    want = expected([(m, None) for m in [*shared(2), *various(3), *shared(1)]])
    assert stored(engine) == want


def test_created_at_is_now_in_utc(engine: sa.Engine, writer: OutboxWriter) -> None:
    before = datetime.now(UTC)
    insert(engine, writer, [(m, None) for m in shared(2)])
    table = outbox.outbox_table(TABLE)
    with engine.connect() as conn:
        stamps = conn.scalars(sa.select(table.c.created_at)).all()
    for stamp in stamps:
        aware = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        assert before - timedelta(seconds=1) <= aware <= datetime.now(UTC)


def test_fanout_rows_keep_their_copies_as_json(engine: sa.Engine, writer: OutboxWriter) -> None:
    base = various(1)[0]
    copies = [
        {"n": 0, "routing_key": "a"},
        {"n": 1, "routing_key": "b", "headers": {"own": [1, 2]}, "persistent": False},
    ]
    rows: list[Row] = [(various(3)[2], None), (base, copies), (shared(1)[0], None)]
    insert(engine, writer, rows)
    got = stored(engine)
    assert got == expected(rows)
    assert [row["copies"] for row in got] == [None, copies, None]


def test_a_fanout_row_alone_keeps_its_copies(engine: sa.Engine, writer: OutboxWriter) -> None:
    copies = [{"n": 0, "routing_key": "a"}, {"n": 1, "routing_key": "b", "priority": 3}]
    rows: list[Row] = [(various(1)[0], copies)]
    insert(engine, writer, rows)
    assert stored(engine) == expected(rows)


def test_insert_returning_ids_gives_the_ids_in_order(
    engine: sa.Engine, writer: OutboxWriter
) -> None:
    messages = various(5)
    with Session(engine) as s, s.begin():
        ids = writer.insert_returning_ids(s, messages, TABLE)
        assert writer.insert_returning_ids(s, [], TABLE) == []
    assert ids == sorted(ids) and len(set(ids)) == 5
    table = outbox.outbox_table(TABLE)
    with engine.connect() as conn:
        by_id = dict(conn.execute(sa.select(table.c.id, table.c.routing_key)).all())
    assert [by_id[i] for i in ids] == [m.routing_key for m in messages]
    assert stored(engine) == expected([(m, None) for m in messages])


def test_a_batch_from_a_template_is_the_rows_of_its_messages(
    engine: sa.Engine, writer: OutboxWriter
) -> None:
    template = various(1)[0]
    batch = TemplateBatch(
        template=template,
        bodies=[b"a", b"", b"\x00\xff"],
        message_ids=["m0", None, "m2"],
        correlation_ids=[None, "c1", "c2"],
    )
    with Session(engine) as s, s.begin():
        writer.insert_batch(s, batch, TABLE)
        writer.insert_batch(
            s,
            TemplateBatch(template=template, bodies=[], message_ids=[], correlation_ids=[]),
            TABLE,
        )
    messages = batch.messages()
    assert [m.body for m in messages] == [b"a", b"", b"\x00\xff"]
    assert stored(engine) == expected([(m, None) for m in messages])


@pytest.mark.parametrize(
    ("bodies", "ids", "error"),
    [
        ([b"a", b"b"], ["m0"], OutboxValueError),
        (["text"], ["m0"], OutboxTypeError),
        ([b"a"], ["x" * 300], OutboxValueError),
    ],
    ids=["lengths", "str-body", "long-id"],
)
def test_an_invalid_batch_is_refused_before_anything_is_written(
    engine: sa.Engine, bodies: list[Any], ids: list[str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        TemplateBatch(
            template=shared(1)[0], bodies=bodies, message_ids=ids, correlation_ids=[None] * len(ids)
        )
    assert stored(engine) == []


def test_nothing_is_written_until_the_caller_commits(
    engine: sa.Engine, writer: OutboxWriter
) -> None:
    with Session(engine) as s:
        s.begin()
        writer.insert(s, [(m, None) for m in various(2)], TABLE)
        writer.insert(s, [], TABLE)
        s.rollback()
    assert stored(engine) == []
