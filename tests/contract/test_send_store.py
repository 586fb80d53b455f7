"""Contract of :class:`condmsg.sending.send_rows.SendStore`, run against every adapter."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg import tables
from condmsg.sending import send_rows as adapters
from condmsg.sending.send_rows import SendRows, SendStore
from outbox import OutboxMessage
from outbox.message import Fanout

pytestmark = pytest.mark.postgres

#: The adapter to build, by the fixture's ``psycopg`` flag.
ADAPTERS: dict[bool, type[SendStore]] = {
    False: adapters.SqlAlchemySendStore,
    True: adapters.PsycopgSendStore,
}
SENT_AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


@pytest.fixture
def engine(adapter_backend: tuple[str, bool]) -> Iterator[sa.Engine]:
    eng = sa.create_engine(adapter_backend[0])
    tables.metadata.create_all(eng)
    outbox.create_tables(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def store(adapter_backend: tuple[str, bool]) -> SendStore:
    return ADAPTERS[adapter_backend[1]]()


def send_rows(*cm_ids: str, destinations: tuple[str, ...] = ("q0", "q1")) -> SendRows:
    """What a sender writes for ``cm_ids``, two destinations each by default."""
    rows = SendRows()
    for i, cm_id in enumerate(cm_ids):
        rows.cms.append(
            {
                "cm_id": cm_id,
                "sender": "s",
                "sent_at": SENT_AT,
                "condition_json": '{"d":"q0"}',
                "evaluation_deadline": SENT_AT + timedelta(seconds=30),
                "content_type": None if i else "application/json",
                "payload_size": 1000 * i,
                "notify_success": i % 2 == 0,
                "state": "pending",
                "next_check_at": None if i else SENT_AT + timedelta(seconds=5),
            }
        )
        for d in destinations:
            copy = {"cm_id": cm_id, "destination": d, "recipient": None if i else "r"}
            copy |= {"message_id": f"{cm_id}.{d}", "exchange": "", "routing_key": d}
            rows.copies.append(copy | {"requires": "read", "parts": 1 + i})
            comp = {"cm_id": cm_id, "destination": d, "body": bytes([i, 0, 255])}
            rows.compensations.append(comp | {"content_type": None, "system_generated": i == 0})
        message = OutboxMessage(
            exchange="",
            routing_key=destinations[0],
            body=bytes([i]) * 10,
            headers={"condmsg-cm-id": cm_id, "n": i},
            message_id=None if len(destinations) > 1 else f"{cm_id}.m",
        )
        copies = tuple(
            {"routing_key": d, "message_id": f"{cm_id}.{d}", "headers": {"d": d}}
            for d in destinations
        )
        rows.outbox.append(Fanout(message, copies if len(copies) > 1 else ({},)))
    return rows


def outbox_rows(engine: sa.Engine) -> list[dict[str, Any]]:
    """The outbox rows as the relay reads them, in id order (ids and times aside)."""
    table = outbox.outbox_table(outbox.DEFAULT_TABLE_NAME)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
    return [{k: v for k, v in row.items() if k not in ("id", "created_at")} for row in rows]


def expected_outbox(rows: SendRows) -> list[dict[str, Any]]:
    """What :func:`outbox.enqueue_fanouts` writes for the same fan-outs (its one definition
    of an outbox row), read back from a database of its own."""
    eng = sa.create_engine("sqlite://")
    outbox.create_tables(eng)
    with Session(eng) as s, s.begin():
        outbox.enqueue_fanouts(s, rows.outbox)
    try:
        return outbox_rows(eng)
    finally:
        eng.dispose()


def aware(value: Any) -> Any:
    """SQLite hands back naive datetimes; every one stored here is UTC."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def stored(engine: sa.Engine, table: sa.Table, columns: list[str]) -> list[dict[str, Any]]:
    """``columns`` of every row of ``table``, ordered by them."""
    cols = [table.c[c] for c in columns]
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*cols).order_by(*cols)).all()
    return [{c: aware(v) for c, v in zip(columns, row, strict=True)} for row in rows]


@pytest.mark.parametrize(
    "rows",
    [send_rows("cm-a", "cm-b", "cm-c"), send_rows("cm-b", destinations=("q0",)), send_rows("cm-a")],
    ids=["several", "one-row-each", "one-cm"],
)
def test_add_writes_every_row_as_given(engine: sa.Engine, store: SendStore, rows: SendRows) -> None:
    with Session(engine) as s, s.begin():
        store.add(s, rows)
    for table, values in rows.by_table():
        columns = list(values[0])
        want = sorted(values, key=lambda row: [str(row[c]) for c in columns])
        got = stored(engine, table, columns)
        assert sorted(got, key=lambda row: [str(row[c]) for c in columns]) == want
    with engine.connect() as conn:  # columns a send leaves to the evaluator
        unset = conn.execute(sa.select(tables.cms.c.decided_at, tables.cms.c.reasons_json)).all()
    assert set(unset) == {(None, None)}
    assert outbox_rows(engine) == expected_outbox(rows)


def test_add_committed_writes_the_rows_in_a_transaction_of_their_own(
    engine: sa.Engine, store: SendStore
) -> None:
    rows = send_rows("cm-a", "cm-b")
    store.add_committed(engine, rows)
    assert [r["cm_id"] for r in stored(engine, tables.cms, ["cm_id"])] == ["cm-a", "cm-b"]
    assert len(stored(engine, tables.copies, ["message_id"])) == 4
    assert outbox_rows(engine) == expected_outbox(rows)


def test_add_committed_writes_nothing_if_it_fails_and_leaves_the_connection_as_it_was(
    engine: sa.Engine, store: SendStore
) -> None:
    store.add_committed(engine, send_rows("cm-a"))
    with pytest.raises(sa.exc.IntegrityError):
        store.add_committed(engine, send_rows("cm-b", "cm-a"))
    assert [r["cm_id"] for r in stored(engine, tables.cms, ["cm_id"])] == ["cm-a"]
    assert len(outbox_rows(engine)) == 1
    # The pooled connection is transactional again: a caller's rollback still undoes.
    with Session(engine) as s:
        s.begin()
        store.add(s, send_rows("cm-c"))
        s.rollback()
    assert [r["cm_id"] for r in stored(engine, tables.cms, ["cm_id"])] == ["cm-a"]
    assert len(outbox_rows(engine)) == 1


def test_cm_reads_one_row_or_none(engine: sa.Engine, store: SendStore) -> None:
    with Session(engine) as s, s.begin():
        store.add(s, send_rows("cm-a", "cm-b"))
    with Session(engine) as s:
        row = store.cm(s, "cm-b")
        assert store.cm(s, "cm-unknown") is None
    assert row is not None
    assert (row.cm_id, row.payload_size, row.state, aware(row.sent_at)) == (
        "cm-b",
        1000,
        "pending",
        SENT_AT,
    )
    with engine.connect() as conn:  # a plain connection serves as well as a session
        assert store.cm(conn, "cm-a") is not None


def test_a_cm_id_stored_already_is_an_integrity_error(engine: sa.Engine, store: SendStore) -> None:
    with Session(engine) as s, s.begin():
        store.add(s, send_rows("cm-a"))
    with Session(engine) as s, pytest.raises(sa.exc.IntegrityError), s.begin():
        store.add(s, send_rows("cm-b", "cm-a"))
    assert [row["cm_id"] for row in stored(engine, tables.cms, ["cm_id"])] == ["cm-a"]
    assert len(stored(engine, tables.copies, ["message_id"])) == 2


def test_nothing_is_written_until_the_caller_commits(engine: sa.Engine, store: SendStore) -> None:
    with Session(engine) as s:
        s.begin()
        store.add(s, send_rows("cm-a"))
        store.add(s, SendRows())
        s.rollback()
    for table in (tables.cms, tables.copies, tables.compensations):
        assert stored(engine, table, ["cm_id"]) == []
    assert outbox_rows(engine) == []
