"""The receiver's PostgreSQL fast path (ackd.fastpath): prepared statements that the
server may forget, and values written into statements as literals (real PostgreSQL and
RabbitMQ)."""

from __future__ import annotations

import gc
import json
import weakref
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from ackd import fastpath
from ackd.receiver_store import SqlAlchemyReceiverStore
from ackd.receiver_store_psycopg import PsycopgReceiverStore
from ackd.tables import rlog
from condmsg import Destination
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.protocol import AckMessage
from condmsg.infra.fastpaths import gate
from outbox.enqueueing import row_values
from outbox.message import OutboxMessage
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import acks_in, get_all, sender_name

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

app = sa.Table(
    "app_fastpath",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36), nullable=False),
)

PREPARED = sa.text("SELECT name FROM pg_prepared_statements WHERE name LIKE 'condmsg_%'")


def test_a_forgotten_prepared_statement_falls_back_to_the_plain_one(
    pg_url: str,
    unique_name: str,
    make_sender: Any,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg runs ``DEALLOCATE ALL`` after a rollback once it prepared statements of its
    own, and an app may run it too. Whether the server forgets them before the claim or
    in the middle of the app's transaction, through SQLAlchemy (the receiver notices) or
    past it (it does not), every read commits exactly once with its COMMIT ack, and a
    later claim prepares them again."""
    # No store check for sequences after the first read: it would begin the transaction
    # before the claim (the claim then runs inside it, unprepared), hiding what is tested.
    monkeypatch.setattr("ackd.reader.STORE_RECHECK_S", 3600.0)
    name = sender_name(unique_name)
    queue = f"{unique_name}.q"
    sender = make_sender(pg_url, name)
    # Quotes, backslashes and non-ASCII text travel into the statements as literals.
    recipient = "o'brien \\ zoë"
    receiver = make_receiver(pg_url, recipient, app_tables=app.metadata)
    cm_ids = [
        sender.send(b"task", Destination(queue, process_within=timedelta(seconds=30)))
        for _ in range(8)
    ]
    with sender.relay() as relay:
        relay.drain(10)

    def forget(session: Any, how: str) -> None:
        if how == "sqlalchemy":
            session.execute(sa.text("DEALLOCATE ALL"))
        else:  # past SQLAlchemy, on the driver's connection
            session.connection().connection.driver_connection.execute("DEALLOCATE ALL")

    def read_one(*, forget_before_commit: str | None = None) -> str:
        with receiver.transaction() as tx:
            message = tx.read(queue, timeout=5)
            assert message is not None
            tx.session.execute(sa.insert(app).values(cm_id=message.cm_id))
            if forget_before_commit:
                forget(tx.session, forget_before_commit)
            return str(message.cm_id)

    def prepared_now() -> int:
        with receiver.transaction() as tx:  # the receiver's own connection
            return len(tx.session.execute(PREPARED).all())

    def forget_between(how: str) -> None:
        with receiver.transaction() as tx:
            forget(tx.session, how)

    read = [read_one()]  # the first claim runs after the store check, unprepared
    read.append(read_one())
    assert prepared_now() == 2  # the claim's and the ack's, prepared ahead of the claim
    # Gone in the middle of the transaction, as the receiver sees: a plain ack.
    read.append(read_one(forget_before_commit="sqlalchemy"))
    assert prepared_now() == 0
    read.append(read_one())
    assert prepared_now() == 2  # prepared again
    # Gone between transactions, as the receiver sees: the claim prepares them again.
    forget_between("sqlalchemy")
    read.append(read_one())
    assert prepared_now() == 2
    # Gone between transactions unseen: the claim falls back (the ack too: nothing is
    # prepared until the next claim).
    forget_between("driver")
    read.append(read_one())
    assert prepared_now() == 0
    read.append(read_one())
    assert prepared_now() == 2
    # Gone in the middle of the transaction unseen: that commit fails, the message is
    # requeued, and the next read commits it.
    with pytest.raises(sa.exc.DBAPIError) as failed:
        read_one(forget_before_commit="driver")
    assert getattr(failed.value.orig, "sqlstate", None) == "26000"
    read.append(read_one())

    assert sorted(read) == sorted(cm_ids)
    with receiver.engine.connect() as conn:
        assert sorted(conn.execute(sa.select(app.c.cm_id)).scalars()) == sorted(cm_ids)
        rows = conn.execute(sa.select(rlog.c.recipient, rlog.c.state)).all()
    assert [(r.recipient, r.state) for r in rows] == [(recipient, "consumed")] * 8
    with receiver.relay() as relay:
        relay.drain(10)
    acks = acks_in(channel, name)
    assert sorted(a.cm_id for a in acks) == sorted(cm_ids)
    assert {a.kind for a in acks} == {AckKind.COMMIT}
    assert {a.recipient for a in acks} == {recipient}
    assert get_all(channel, queue, settle_s=0.1) == []


@pytest.mark.parametrize("standard_strings", ["on", "off"])
def test_values_become_literals_that_read_back_exactly(
    pg_engine_url: str, standard_strings: str
) -> None:
    url = sa.engine.make_url(pg_engine_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database, autocommit=True
    ) as raw:
        raw.execute(f"SET standard_conforming_strings = {standard_strings}")
        literal = fastpath._Literals(raw)
        instant = datetime(2026, 11, 22, 8, 30, 1, 123456, tzinfo=UTC)
        cases: list[tuple[Any, str, Any]] = [
            ("it's \\ 'quoted' \\\\ E'x' ; -- zoë ☃", "text", None),
            ("", "text", None),
            (None, "text", None),
            (True, "boolean", None),
            (False, "boolean", None),
            (-42, "bigint", None),
            (instant, "timestamptz", None),
            (instant.astimezone(timezone(timedelta(hours=5))), "timestamptz", instant),
            (bytes(range(256)), "bytea", None),
            ({"a": "it's", "b": [1, None, "\\"]}, "json", None),
        ]
        for value, type_, expected in cases:
            sql = f"SELECT CAST({literal(value)} AS {type_})"
            (got,) = raw.execute(sql).fetchone() or (object(),)
            if type_ == "json":
                got = json.loads(json.dumps(got))
            assert got == (value if expected is None else expected), sql
        with pytest.raises(psycopg.DataError):
            literal("nul \x00 inside")


def test_a_connection_the_fast_path_knew_can_still_be_collected(pg_engine_url: str) -> None:
    """What the fast path keeps per connection must not keep the connection alive."""
    url = sa.engine.make_url(pg_engine_url)
    raw = psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    fastpath._prepared(raw).literal("it's")
    gone = weakref.ref(raw)
    raw.close()
    del raw
    gc.collect()
    assert gone() is None


def test_the_ack_row_holds_every_column_the_portable_path_writes(
    pg_url: str, unique_name: str, make_sender: Any, make_receiver: Any
) -> None:
    """The fast path writes the ack's constant columns into its statement's text: the row
    must hold what ``outbox.enqueueing.row_values`` gives for the ack message."""
    name = sender_name(unique_name)
    queue = f"{unique_name}.q"
    sender = make_sender(pg_url, name)
    receiver = make_receiver(pg_url)
    cond = Destination(queue, pickup_within=timedelta(seconds=30))
    cm_ids = [sender.send(b"task", cond) for _ in range(3)]
    with sender.relay() as relay:
        relay.drain(10)
    for _ in cm_ids:  # the first claim runs unprepared, the later ones prepared
        with receiver.transaction() as tx:
            assert tx.read(queue, timeout=5) is not None
    table = outbox_table()
    with receiver.engine.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
    assert sorted(row["correlation_id"] for row in rows) == sorted(cm_ids)
    for row in rows:
        ack = AckMessage.from_json(row["body"])
        assert ack.kind is AckKind.COMMIT
        expected = row_values(
            ack_message_of(ack, reply_to=protocol.ack_queue(name)), row["created_at"]
        )
        assert {c: row[c] for c in expected} == expected


def ack_message_of(ack: AckMessage, *, reply_to: str) -> OutboxMessage:
    return OutboxMessage(
        exchange="",
        routing_key=reply_to,
        body=ack.to_json(),
        message_id=ack.ack_id,
        correlation_id=ack.cm_id,
        content_type=protocol.ACK_CONTENT_TYPE,
        message_type=protocol.ACK_TYPE,
    )


def test_only_plain_constants_are_written_into_the_statement() -> None:
    row = {"state": "pending", "content_type": "it's", "headers": None, "body": b"x"}
    sql, values = fastpath.ack_statement(row)
    assert "'pending'" in sql.prepared and "NULL" in sql.prepared
    assert "it's" not in sql.prepared  # needs escaping: a parameter
    assert list(values) == ["it's", b"x"]


@pytest.mark.parametrize(
    ("version", "forced", "fast"),
    [
        ("3.3.9", None, True),
        ("3.2.4", None, False),  # older than the releases it was tested with
        ("3.4.0", None, False),  # newer
        ("3.3.9", "plain", False),
        ("3.4.0", "fast", True),  # trying a new release
    ],
)
def test_a_receiver_takes_the_fast_path_on_tested_psycopg_releases_only(
    version: str,
    forced: str | None,
    fast: bool,
    pg_url: str,
    make_receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(psycopg, "__version__", version)
    if forced is not None:
        monkeypatch.setenv(fastpath.ENV_FASTPATH, forced)
    else:
        monkeypatch.delenv(fastpath.ENV_FASTPATH, raising=False)
    receiver = make_receiver(pg_url)
    assert type(receiver.store) is (PsycopgReceiverStore if fast else SqlAlchemyReceiverStore)


def test_the_fast_path_is_not_taken_without_the_psycopg_calls_it_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gate, "_told", set())
    monkeypatch.delattr(psycopg.errors, "error_from_result")
    assert not fastpath.chosen({})
    with pytest.raises(ValueError, match=r"lacks errors\.error_from_result"):
        fastpath.chosen({fastpath.ENV_FASTPATH: "fast"})
