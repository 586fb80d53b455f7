"""Send and receive benchmark: conditional messages next to raw pika + PostgreSQL.

(a) Send: CMs to 1 and to 4 destinations from ``--senders`` threads, in two variants:
    ``Sender.send()`` (one PostgreSQL transaction per CM) and ``Sender.send_many()`` with
    ``--batch`` CMs per call (one transaction per batch: how a producer sends at volume),
    ``--cms`` CMs batched and ``--single-cms`` one per transaction (a commit per send
    bounds that variant; it needs fewer to be measured). A measurement that lasts a
    fraction of a second is mostly the relay's start (its first wake-up and claim) and
    the last copy's settling: 5,000 CMs make the batched runs last about a second.
    The sender's relay runs meanwhile, by default as a ``condmsg relay`` process
    (``--relay thread``: in-process). Throughput = copies that reached the destination
    queues per second, from the first send until every copy is in RabbitMQ (passive
    ``queue_declare`` counts). Raw baseline: a bare pika SelectConnection publishing as
    many messages as the batched variant's copies, with the properties and headers of a
    real copy, to the same queues with the relay's confirm window (batch 500 x 4 in
    flight). Target: CM / raw >= 0.5 for the batched variant (the raw publisher's
    confirm window is its batching: neither waits for a durable write per message).
    One send per transaction has its own baseline too: a raw one-row outbox insert and
    commit through psycopg (the row a one-destination send writes to the outbox, into an
    outbox table of its own that no relay drains), ``--single-cms`` transactions from as
    many threads, each on its own connection; target: sends committed per second / raw
    transactions per second >= 0.5. And ``send(session=...)`` inside the caller's
    transaction: one thread runs the caller's transaction (one app row through psycopg,
    then commit) ``--session-txns`` times with and as often without a send in it,
    alternating; target: p50 with the send minus p50 without < 0.3 ms. Both are measured
    with the sender's relay publishing on the same two cores, as deployed, and again
    before the relay starts (its outbox rows deleted, nothing published), for
    information: the raw baseline's rows are not relayed, so that pair says what the send
    itself costs.
(b) Receive: a ``Receiver`` with a PostgreSQL store handles copies one transaction each,
    inserting one app row as the raw baseline does (its SQL through psycopg's
    ``execute``, on the transaction's connection); measured both as
    ``consume(transactional=True)`` and as ``transaction()`` + ``tx.read()``, and for
    information as ``consume`` with the app row written through SQLAlchemy
    (``consume_sa``: ``exec_driver_sql``; ``consume_orm``: the ORM session's
    ``execute``), where SQLAlchemy's cost counts against condmsg. The
    COMMIT ack is written to the receiver's outbox in the same transaction; the ack relay
    does not run unless ``--ack-relay`` (the comparison is the consuming side). Raw
    baseline: pika ``basic_consume`` with the same prefetch, one psycopg transaction (one
    app row) per message, then ``basic_ack``. Target: the faster of ``consume`` and
    ``transaction_read`` / raw >= 0.7.

Baselines and subjects alternate, ``--rounds`` times; figures are medians over rounds.
``--receive`` messages (3,000) make each receive measurement long enough that the
consumer's start (qos, consume, the first prefetch window) does not weigh on either side.
Sender and receiver each get a fresh PostgreSQL schema (dropped afterwards); queues are
unique to the run and deleted afterwards.

The receiver's store adapter is ``CONDMSG_BENCH_RECEIVER_STORE``: ``psycopg`` (default: the
claim and the COMMIT ack ride on the transaction's ``BEGIN`` and ``COMMIT``) or
``portable`` (the SQLAlchemy Core adapter, on the same PostgreSQL); two runs, one of each,
alternated, say what the psycopg adapter gains.

Run: ``python -m bench.send_receive [--cms 2000]`` (env ``CONDMSG_BENCH_PG_URL``,
``CONDMSG_AMQP_URL``, ``CONDMSG_BENCH_RECEIVER_STORE``). The last line of stdout is one JSON
object with every figure (``receiver_store`` among them).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pika
import psycopg
import sqlalchemy as sa
from pika.adapters.blocking_connection import BlockingChannel
from pika.adapters.select_connection import SelectConnection
from psycopg.types.json import Json
from sqlalchemy.orm import Session

from ackd.message import Message
from ackd.receiver import Handler, Receiver
from ackd.receiver_store import ReceiverStore, SqlAlchemyReceiverStore
from ackd.receiver_store_psycopg import PsycopgReceiverStore
from bench._common import (
    Row,
    emit_result,
    fresh_pg_schema,
    log,
    percentile,
    psycopg_conninfo,
    row,
    timed,
    wait_until,
)
from condmsg import Condition, Destination, DestinationSet
from condmsg.core import protocol
from condmsg.sending.sender import Outgoing, Sender
from outbox.relay import Relay
from outbox.table import DEFAULT_TABLE_NAME
from outbox.table import create_tables as create_outbox_table

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
RELAY_BATCH, RELAY_IN_FLIGHT = 500, 4  # the relay's defaults; the raw publisher's window
SEND_TARGET, RECEIVE_TARGET = 0.5, 0.7
#: Single sends: sends/s over raw one-row outbox transactions/s; milliseconds a
#: ``send(session=...)`` may add to the caller's transaction (p50).
SINGLE_SEND_TARGET, SESSION_ADDED_TARGET_MS = 0.5, 0.3
RAW_OUTBOX = "bench_raw_outbox"
PICKUP = timedelta(seconds=60)
SECRET = b"bench-send-receive-secret-3f7b9a1c"
#: Which receiver store adapter the receive measurement uses.
RECEIVER_STORE_ENV = "CONDMSG_BENCH_RECEIVER_STORE"
RECEIVER_STORES: dict[str, Callable[[], ReceiverStore]] = {
    "psycopg": PsycopgReceiverStore,
    "portable": SqlAlchemyReceiverStore,
}

APP = sa.Table(
    "bench_app",
    sa.MetaData(),
    sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36)),
    sa.Column("body", sa.LargeBinary(), nullable=False),
)
RAW_INSERT = "INSERT INTO bench_app (cm_id, body) VALUES (%s, %s)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    cms: int
    single_cms: int
    session_txns: int
    size: int
    senders: int
    batch: int
    receive: int
    prefetch: int
    rounds: int
    ack_relay: bool
    relay: str
    parts: tuple[str, ...]
    receiver_store: str


def parse_args() -> Options:
    ap = argparse.ArgumentParser(prog="python -m bench.send_receive", description=__doc__)
    ap.add_argument("--cms", type=int, default=5000, help="CMs per batched send measurement")
    ap.add_argument(
        "--single-cms", type=int, default=1000, help="CMs per one-transaction-per-send measurement"
    )
    ap.add_argument(
        "--session-txns",
        type=int,
        default=500,
        help="caller transactions with (and as many without) a send(session=...), per round",
    )
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--senders", type=int, default=4, help="threads calling Sender.send")
    ap.add_argument("--batch", type=int, default=100, help="sends per session, batched variant")
    ap.add_argument("--receive", type=int, default=3000, help="messages per receive measurement")
    ap.add_argument("--prefetch", type=int, default=100, help="consumer prefetch, CM and raw")
    ap.add_argument("--rounds", type=int, default=3, help="baseline/subject alternations")
    ap.add_argument("--ack-relay", action="store_true", help="run the ack relay while receiving")
    ap.add_argument(
        "--relay",
        choices=("process", "thread"),
        default="process",
        help="the sender's relay while sending: `condmsg relay` process (default) or in-process",
    )
    ap.add_argument(
        "--parts",
        default="send,receive",
        help="comma-separated parts to run: send, receive (default: both)",
    )
    a = ap.parse_args()
    parts = tuple(part.strip() for part in a.parts.split(",") if part.strip())
    if not parts or set(parts) - {"send", "receive"}:
        ap.error("--parts takes send, receive or both")
    receiver_store = os.environ.get(RECEIVER_STORE_ENV, "psycopg")
    if receiver_store not in RECEIVER_STORES:
        ap.error(
            f"{RECEIVER_STORE_ENV} takes {' or '.join(RECEIVER_STORES)}, not {receiver_store!r}"
        )
    return Options(
        cms=a.cms,
        single_cms=a.single_cms,
        session_txns=a.session_txns,
        size=a.size,
        senders=a.senders,
        batch=a.batch,
        receive=a.receive,
        prefetch=a.prefetch,
        rounds=a.rounds,
        ack_relay=a.ack_relay,
        relay=a.relay,
        parts=parts,
        receiver_store=receiver_store,
    )


# -- broker helpers -----------------------------------------------------------------------


class Queues:
    """Depth checks and purges over one admin channel (main thread only)."""

    def __init__(self) -> None:
        self._conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self.channel: BlockingChannel = self._conn.channel()

    def depth(self, queues: Sequence[str]) -> int:
        return sum(self.channel.queue_declare(q, passive=True).method.message_count for q in queues)

    def wait_depth(self, queues: Sequence[str], expected: int, timeout_s: float = 120) -> None:
        if not wait_until(lambda: self.depth(queues) >= expected, timeout_s, poll_s=0.005):
            raise RuntimeError(f"only {self.depth(queues)}/{expected} messages in {queues}")

    def purge(self, queues: Sequence[str]) -> None:
        for q in queues:
            self.channel.queue_purge(q)

    def delete(self, queues: Sequence[str]) -> None:
        for q in queues:
            self.channel.queue_delete(q)

    def close(self) -> None:
        self._conn.close()


def raw_publish(
    queues: Sequence[str], count: int, body: bytes, props: pika.BasicProperties
) -> float:
    """Publish ``count`` messages round-robin over ``queues`` with windowed confirms.

    Returns the seconds from the first publish to the last confirm (connection setup is
    excluded, as the relay's connection is already open when a send measurement starts).
    """
    window = RELAY_BATCH * RELAY_IN_FLIGHT
    confirmed = bytearray(count + 1)  # by delivery tag (1-based)
    st: dict[str, Any] = {"sent": 0, "acked": 0, "low": 1, "t0": 0.0, "t1": 0.0, "err": None}

    def pump() -> None:
        channel = st["channel"]
        while st["sent"] - st["acked"] < window and st["sent"] < count:
            channel.basic_publish("", queues[st["sent"] % len(queues)], body, props, True)
            st["sent"] += 1

    def mark(tag: int) -> None:
        if not confirmed[tag]:
            confirmed[tag] = 1
            st["acked"] += 1

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            st["err"] = f"nack for delivery tag {method.delivery_tag}"
            st["conn"].close()
            return
        if method.multiple:
            for tag in range(st["low"], method.delivery_tag + 1):
                mark(tag)
        else:
            mark(method.delivery_tag)
        while st["low"] <= count and confirmed[st["low"]]:
            st["low"] += 1
        if st["acked"] >= count:
            st["t1"] = time.perf_counter()
            st["conn"].close()
        else:
            pump()

    def on_confirm_mode(_frame: Any) -> None:
        st["t0"] = time.perf_counter()
        pump()

    def on_channel(channel: Any) -> None:
        st["channel"] = channel
        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=on_confirm_mode)

    conn = SelectConnection(
        pika.URLParameters(AMQP_URL),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda c, _e: c.ioloop.stop(),
    )
    st["conn"] = conn
    conn.ioloop.start()
    if st["err"] or not st["t1"]:
        raise RuntimeError(f"raw publish failed: {st['err'] or 'connection closed early'}")
    return float(st["t1"] - st["t0"])


# -- (a) send -----------------------------------------------------------------------------


def run_threads(threads: int, work: Callable[[int], None]) -> None:
    """Run ``work(k)`` in ``threads`` threads started together; re-raise the first error."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def body(k: int) -> None:
        barrier.wait()
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=body, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def send_cms(
    sender: Sender, payload: bytes, cond: Condition, n: int, threads: int, batch: int
) -> None:
    """``n`` sends from ``threads`` threads; ``batch`` > 1 sends ``batch`` CMs per
    ``send_many`` call (one transaction each)."""

    def work(k: int) -> None:
        mine = n // threads + (1 if k < n % threads else 0)
        if batch <= 1:
            for _ in range(mine):
                sender.send(payload, cond)
            return
        for start in range(0, mine, batch):
            outgoing = Outgoing(payload=payload, condition=cond)
            sender.send_many([outgoing] * min(batch, mine - start))

    run_threads(threads, work)


def cm_send_rate(
    sender: Sender,
    admin: Queues,
    payload: bytes,
    cond: Condition,
    queues: Sequence[str],
    o: Options,
    batch: int,
) -> tuple[float, float]:
    """(copies reaching the queues per second, sends committed per second)."""
    cms = o.cms if batch > 1 else o.single_cms
    expected = cms * len(queues)
    with timed() as total:
        with timed() as sending:
            send_cms(sender, payload, cond, cms, o.senders, batch)
        admin.wait_depth(queues, expected)
    admin.purge(queues)
    return expected / total.seconds, cms / sending.seconds


def sample_copy(admin: Queues, queue: str) -> pika.BasicProperties:
    """The properties (headers included) of one real copy waiting in ``queue``."""
    method, props, _body = admin.channel.basic_get(queue, auto_ack=True)
    if method is None or props is None:
        raise RuntimeError(f"no copy in {queue} to take the properties from")
    return props


def raw_outbox_insert(props: pika.BasicProperties) -> tuple[str, dict[str, Any]]:
    """The SQL and fixed values of the raw baseline's row: what a one-destination send
    writes to the outbox (a real copy's properties and headers)."""
    columns = {
        "exchange": "''",
        "routing_key": "%(routing_key)s",
        "body": "%(body)s",
        "message_id": "%(message_id)s",
        "correlation_id": "%(correlation_id)s",
        "reply_to": "%(reply_to)s",
        "content_type": "%(content_type)s",
        "message_type": "%(message_type)s",
        "headers": "%(headers)s",
        "persistent": "true",
        "mandatory": "true",
        "created_at": "now()",
        "state": "'pending'",
        "attempts": "0",
    }
    sql = f"INSERT INTO {RAW_OUTBOX} ({', '.join(columns)}) VALUES ({', '.join(columns.values())})"
    values = {
        "correlation_id": props.correlation_id,
        "reply_to": props.reply_to,
        "content_type": props.content_type,
        "message_type": props.type,
        "headers": Json(props.headers or {}),
    }
    return sql, values


def raw_outbox_rate(
    db_url: str, props: pika.BasicProperties, queue: str, payload: bytes, n: int, threads: int
) -> float:
    """Raw one-row outbox transactions per second: ``n`` INSERT + COMMIT through psycopg
    from ``threads`` threads, each on its own connection (connecting is not timed)."""
    sql, fixed = raw_outbox_insert(props)
    conns = [psycopg.connect(psycopg_conninfo(db_url)) for _ in range(threads)]

    def work(k: int) -> None:
        conn = conns[k]
        for _ in range(n // threads + (1 if k < n % threads else 0)):
            conn.execute(
                sql, fixed | {"routing_key": queue, "body": payload, "message_id": uuid.uuid4().hex}
            )
            conn.commit()

    try:
        with timed() as sw:
            run_threads(threads, work)
    finally:
        for conn in conns:
            conn.close()
    return n / sw.seconds


def session_added_ms(
    sender: Sender, payload: bytes, cond: Condition, n: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of ``n`` caller transactions without a send and ``n`` with one
    ``send(session=...)`` in them, alternating; each writes one app row through psycopg
    (on the session's connection) and commits."""
    without: list[float] = []
    with_send: list[float] = []
    for i in range(2 * n):
        send = i % 2 == 1
        started = time.perf_counter()
        with Session(sender.engine) as session, session.begin():
            driver = session.connection().connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            driver.execute(RAW_INSERT, (None, payload))
            if send:
                sender.send(payload, cond, session=session)
        (with_send if send else without).append((time.perf_counter() - started) * 1000)
    return without, with_send


# -- (b) receive --------------------------------------------------------------------------


def fill(sender: Sender, relay: Relay, admin: Queues, payload: bytes, queue: str, n: int) -> None:
    """Put ``n`` fresh copies in ``queue`` (batched sends, relayed; not timed)."""
    outgoing = Outgoing(payload=payload, condition=Destination(queue, pickup_within=PICKUP))
    for start in range(0, n, 500):
        sender.send_many([outgoing] * min(500, n - start))
    relay.drain(timeout_s=120)
    admin.wait_depth([queue], n)


def raw_receive(db_url: str, queue: str, n: int, prefetch: int) -> float:
    """pika consume + one psycopg transaction (one app row) + basic_ack per message."""
    db = psycopg.connect(psycopg_conninfo(db_url), autocommit=True)
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = conn.channel()
    got = 0
    with timed() as sw:
        channel.basic_qos(prefetch_count=prefetch)
        for method, props, body in channel.consume(queue, inactivity_timeout=10):
            if method is None or props is None or method.delivery_tag is None:
                break  # inactivity: the queue ran dry early
            with db.transaction():
                db.execute(RAW_INSERT, ((props.headers or {}).get(protocol.H_CM_ID), body))
            channel.basic_ack(method.delivery_tag)
            got += 1
            if got == n:
                break
    channel.cancel()
    conn.close()
    db.close()
    if got != n:
        raise RuntimeError(f"raw consumer got {got}/{n}")
    return sw.seconds


def app_row(message: Message, session: Session | None) -> None:
    """The app's row as the raw baseline writes it: the same SQL through psycopg's
    ``execute``, on the transaction's connection (both sides do the same application
    work the same way; what differs is condmsg's)."""
    assert session is not None
    driver = session.connection().connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    driver.execute(RAW_INSERT, (message.cm_id, message.body))


def app_row_sa(message: Message, session: Session | None) -> None:
    """The same SQL through SQLAlchemy's ``exec_driver_sql`` (its Core execution's CPU
    then counts against condmsg)."""
    assert session is not None
    session.connection().exec_driver_sql(RAW_INSERT, (message.cm_id, message.body))


def app_row_orm(message: Message, session: Session | None) -> None:
    """The app's row through the ORM session's ``execute`` (SQLAlchemy's own cost is then
    part of the figure)."""
    assert session is not None
    session.execute(sa.insert(APP), [{"cm_id": message.cm_id, "body": message.body}])


def cm_consume(
    receiver: Receiver, queue: str, n: int, prefetch: int, handler: Handler = app_row
) -> float:
    with timed() as sw:
        got = receiver.consume(
            queue,
            handler,
            transactional=True,
            prefetch=prefetch,
            max_messages=n,
            idle_timeout_s=10,
        )
    if got != n:
        raise RuntimeError(f"Receiver.consume handled {got}/{n}")
    return sw.seconds


def cm_transaction_read(receiver: Receiver, queue: str, n: int, _prefetch: int) -> float:
    with timed() as sw:
        for i in range(n):
            with receiver.transaction() as tx:
                message = tx.read(queue, timeout=10)
                if message is None:
                    raise RuntimeError(f"tx.read timed out after {i}/{n}")
                app_row(message, tx.session)
    return sw.seconds


def count_rows(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


# -- main ---------------------------------------------------------------------------------


def ratio_line(label: str, subject: float, raw: float, target: float | None, unit: str) -> None:
    held = "" if target is None else f" (target >= {target})"
    print(f"{label}: {subject:,.0f} {unit}, raw {raw:,.0f} {unit}, ratio {subject / raw:.2f}{held}")


@dataclass(slots=True, kw_only=True)
class Bench:
    """What the measurements share: options, the admin channel, the sender and its relay."""

    o: Options
    admin: Queues
    sender: Sender
    relay: Relay
    payload: bytes
    dests: list[str]
    rx: str
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)


@contextmanager
def sending_relay(mode: str, relay: Relay, db_url: str) -> Iterator[None]:
    """The sender's relay during the send measurements: by default a ``condmsg relay``
    process (the deployment docs/outbox.md recommends: it publishes on the second core
    while the sending process records CMs), else the in-process relay thread."""
    if mode == "thread":
        with relay:
            yield
        return
    env = dict(os.environ, CONDMSG_DB_URL=db_url, CONDMSG_AMQP_URL=AMQP_URL)
    command = [sys.executable, "-m", "condmsg.cli", "relay", "--log-level", "WARNING"]
    process = subprocess.Popen(command, env=env)
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def measure_send_alone(b: Bench) -> None:
    """One send per transaction with no relay running, as the raw baseline's outbox rows
    are not relayed either: the send's own cost, without the relay and the broker on the
    same cores. Its outbox rows are deleted afterwards (nothing is published)."""
    o, dest = b.o, b.dests[0]
    one: Condition = Destination(dest, pickup_within=PICKUP)
    db_url = b.sender.engine.url.render_as_string(hide_password=False)
    create_outbox_table(b.sender.engine, table_name=RAW_OUTBOX)
    send_cms(b.sender, b.payload, one, 50, 1, 1)  # declares the queue, warms the pool
    with b.sender.engine.begin() as conn:
        APP.metadata.create_all(conn)
    with b.sender.engine.begin() as conn:
        # The raw baseline writes what a one-destination send writes to the outbox.
        written = conn.execute(
            sa.text(
                "SELECT correlation_id, reply_to, content_type, message_type, headers"
                f" FROM {DEFAULT_TABLE_NAME} LIMIT 1"
            )
        ).one()
        props = pika.BasicProperties(
            correlation_id=written.correlation_id,
            reply_to=written.reply_to,
            content_type=written.content_type,
            type=written.message_type,
            headers=written.headers,
        )
        conn.execute(sa.text(f"DELETE FROM {DEFAULT_TABLE_NAME}"))
    for r in range(o.rounds):
        log(f"send round {r + 1}/{o.rounds}, no relay running ...")
        b.add(
            "raw_outbox_alone",
            raw_outbox_rate(db_url, props, dest, b.payload, o.single_cms, o.senders),
        )
        with timed() as sw:
            send_cms(b.sender, b.payload, one, o.single_cms, o.senders, 1)
        b.add("cm_alone", o.single_cms / sw.seconds)
        without, with_send = session_added_ms(b.sender, b.payload, one, o.session_txns)
        b.add("session_alone_added_p50_ms", percentile(with_send, 50) - percentile(without, 50))
        with b.sender.engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM {DEFAULT_TABLE_NAME}"))


def measure_send(b: Bench) -> None:
    """Per round and fan-out: raw publish, then CM sends one per transaction, then batched."""
    o, admin, dests = b.o, b.admin, b.dests
    one: Condition = Destination(dests[0], pickup_within=PICKUP)
    four: Condition = DestinationSet(*(Destination(q) for q in dests), pickup_within=PICKUP)
    log("warming up (declares queues, connects the relay) ...")
    for cond in (one, four):
        send_cms(b.sender, b.payload, cond, 50, 1, 1)
    admin.wait_depth(dests, 250)
    props = sample_copy(admin, dests[0])  # the raw publisher sends copies of a real copy
    admin.purge(dests)
    db_url = b.sender.engine.url.render_as_string(hide_password=False)
    create_outbox_table(b.sender.engine, table_name=RAW_OUTBOX)
    with b.sender.engine.begin() as conn:
        APP.metadata.create_all(conn)
    raw_outbox_rate(db_url, props, dests[0], b.payload, 50, o.senders)
    session_added_ms(b.sender, b.payload, one, 50)
    admin.wait_depth(dests[:1], 50)
    admin.purge(dests)
    for r in range(o.rounds):
        log(f"send round {r + 1}/{o.rounds} ...")
        for cond, queues in ((one, dests[:1]), (four, dests)):
            k, total = len(queues), o.cms * len(queues)
            raw_s = raw_publish(queues, total, b.payload, props)
            admin.wait_depth(queues, total)
            admin.purge(queues)
            b.add(f"raw{k}", total / raw_s)
            for variant, batch in (("cm", 1), ("batched", o.batch)):
                if variant == "cm" and k == 1:
                    b.add(
                        "raw_outbox",
                        raw_outbox_rate(
                            db_url, props, queues[0], b.payload, o.single_cms, o.senders
                        ),
                    )
                rate, commits = cm_send_rate(b.sender, admin, b.payload, cond, queues, o, batch)
                b.add(f"{variant}{k}", rate)
                b.add(f"{variant}_commits{k}", commits)
        without, with_send = session_added_ms(b.sender, b.payload, one, o.session_txns)
        admin.wait_depth(dests[:1], o.session_txns)
        admin.purge(dests[:1])
        b.add("session_without_p50_ms", percentile(without, 50))
        b.add("session_with_p50_ms", percentile(with_send, 50))
        b.add("session_added_p50_ms", percentile(with_send, 50) - percentile(without, 50))


def measure_receive(b: Bench, rcv_url: str, recipient: str) -> int:
    """Per round and mode: raw consume, then the CM mode; returns the acks written."""
    o, rx = b.o, b.rx
    receiver = Receiver(
        amqp_url=AMQP_URL,
        db_url=rcv_url,
        recipient=recipient,
        secret=SECRET,
        store=RECEIVER_STORES[o.receiver_store](),
        create_schema=True,
    )
    APP.metadata.create_all(receiver.engine)
    ack_relay = receiver.start_relay() if o.ack_relay else None
    modes: dict[str, Callable[[Receiver, str, int, int], float]] = {
        "consume": cm_consume,
        "consume_sa": functools.partial(cm_consume, handler=app_row_sa),
        "consume_orm": functools.partial(cm_consume, handler=app_row_orm),
        "transaction_read": cm_transaction_read,
    }
    try:
        log("warming up the receiver ...")
        fill(b.sender, b.relay, b.admin, b.payload, rx, 100)
        cm_consume(receiver, rx, 50, o.prefetch)
        cm_transaction_read(receiver, rx, 50, o.prefetch)
        acks_before = count_rows(receiver.engine, DEFAULT_TABLE_NAME)
        for r in range(o.rounds):
            log(f"receive round {r + 1}/{o.rounds} ...")
            for mode, measure in modes.items():
                fill(b.sender, b.relay, b.admin, b.payload, rx, o.receive)
                b.add(f"raw_{mode}", o.receive / raw_receive(rcv_url, rx, o.receive, o.prefetch))
                fill(b.sender, b.relay, b.admin, b.payload, rx, o.receive)
                b.add(mode, o.receive / measure(receiver, rx, o.receive, o.prefetch))
        if ack_relay is not None:
            ack_relay.drain(timeout_s=60)
            return -1  # relayed acks leave the outbox: not counted there
        return count_rows(receiver.engine, DEFAULT_TABLE_NAME) - acks_before
    finally:
        if ack_relay is not None:
            ack_relay.stop()
        receiver.close()
        receiver.engine.dispose()


def main() -> None:
    o = parse_args()
    run = uuid.uuid4().hex[:8]
    name = f"bench-sr-{run}"
    dests = [f"bench.sr.{run}.d{i}" for i in range(4)]
    rx = f"bench.sr.{run}.rx"
    service = [
        protocol.ack_queue(name),
        protocol.outcome_queue(name),
        protocol.dead_letter_queue(name),
    ]
    admin = Queues()
    try:
        with (
            fresh_pg_schema(PG_URL, "bench_snd") as snd_url,
            fresh_pg_schema(PG_URL, "bench_rcv") as rcv_url,  # the receiver's own store
        ):
            sender = Sender(
                amqp_url=AMQP_URL, db_url=snd_url, name=name, secret=SECRET, create_schema=True
            )
            relay = sender.relay(batch_size=RELAY_BATCH, max_batches_in_flight=RELAY_IN_FLIGHT)
            b = Bench(
                o=o,
                admin=admin,
                sender=sender,
                relay=relay,
                payload=os.urandom(o.size),
                dests=dests,
                rx=rx,
            )
            try:
                acks_written = 0
                if "send" in o.parts:
                    measure_send_alone(b)
                    with sending_relay(o.relay, relay, snd_url):
                        measure_send(b)
                if "receive" in o.parts:
                    with relay:
                        acks_written = measure_receive(b, rcv_url, f"bench-{run}")
            finally:
                sender.engine.dispose()
    finally:
        admin.delete([*dests, rx, *service])
        admin.close()
    report(o, b.samples, acks_written)


def report(o: Options, samples: dict[str, list[float]], acks_written: int) -> None:
    med = {k: statistics.median(v) for k, v in samples.items()}
    figures: dict[str, Any] = {
        "cms": o.cms,
        "single_cms": o.single_cms,
        "payload_bytes": o.size,
        "senders": o.senders,
        "batch": o.batch,
        "receive_messages": o.receive,
        "prefetch": o.prefetch,
        "rounds": o.rounds,
        "ack_relay_running": o.ack_relay,
        "send_relay": o.relay,
        "send_ratio_target": SEND_TARGET,
        "session_txns": o.session_txns,
        "receive_ratio_target": RECEIVE_TARGET,
        "parts": list(o.parts),
        "receiver_store": o.receiver_store,
    }
    if "send" in o.parts:
        figures |= send_figures(med)
    if "receive" in o.parts:
        figures |= receive_figures(o, samples, med, acks_written)
    emit_result("send_receive", figures, table_rows(figures))


def table_rows(figures: dict[str, Any]) -> list[Row]:
    """The rows ``make bench`` prints: each figure held to a target, with its baseline."""
    rows: list[Row] = []
    if "send" in figures["parts"]:
        # One send per transaction is held to the raw one-row outbox transaction below,
        # not to a windowed-confirm publisher.
        for k in ("1", "4"):
            rows.append(
                row(
                    f"send to {k} dest, batched",
                    figures[f"send_{k}dest_batched_copies_per_s"],
                    "copies/s",
                    baseline=figures[f"send_{k}dest_raw_msgs_per_s"],
                    ratio_at_least=SEND_TARGET,
                )
            )
        rows.append(
            row(
                "one send per transaction vs raw outbox txn",
                figures["single_send_sends_per_s"],
                "sends/s",
                baseline=figures["single_send_raw_outbox_txns_per_s"],
                ratio_at_least=SINGLE_SEND_TARGET,
            )
        )
        rows.append(
            row(
                "one send per transaction, no relay running, vs raw outbox txn",
                figures["single_send_alone_sends_per_s"],
                "sends/s",
                baseline=figures["single_send_alone_raw_outbox_txns_per_s"],
            )
        )
        rows.append(
            row(
                "send(session=...) added to the caller's txn, p50",
                figures["session_send_added_p50_ms"],
                "ms",
                baseline=figures["session_send_baseline_txn_p50_ms"],
                lower=SESSION_ADDED_TARGET_MS,
            )
        )
        rows.append(
            row(
                "send(session=...) added, no relay running, p50",
                figures["session_send_alone_added_p50_ms"],
                "ms",
            )
        )
    if "receive" in figures["parts"]:
        rows.append(
            row(
                f"receive, {figures['receive_best_mode']}",
                figures[f"receive_{figures['receive_best_mode']}_msgs_per_s"],
                "msg/s",
                baseline=figures["receive_raw_msgs_per_s"],
                ratio_at_least=RECEIVE_TARGET,
            )
        )
    return rows


def send_figures(med: dict[str, float]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for k in ("1", "4"):
        raw = med[f"raw{k}"]
        for variant, label in (("cm", "one transaction per send"), ("batched", "batched")):
            rate = med[f"{variant}{k}"]
            ratio = rate / raw
            ratio_line(f"send to {k} dest, {label}", rate, raw, SEND_TARGET, "copies/s")
            prefix = f"send_{k}dest" + ("" if variant == "cm" else "_batched")
            figures |= {
                f"{prefix}_copies_per_s": round(rate, 1),
                f"{prefix}_sends_committed_per_s": round(med[f"{variant}_commits{k}"], 1),
                f"{prefix}_ratio": round(ratio, 3),
                f"{prefix}_ok": ratio >= SEND_TARGET,
            }
        figures[f"send_{k}dest_raw_msgs_per_s"] = round(raw, 1)
    figures |= single_send_figures(med)
    return figures


def single_send_figures(med: dict[str, float]) -> dict[str, Any]:
    """One send per transaction against a raw one-row outbox transaction, and what
    ``send(session=...)`` adds to the caller's transaction."""
    sends, raw = med["cm_commits1"], med["raw_outbox"]
    ratio = sends / raw
    ratio_line("one send per transaction", sends, raw, SINGLE_SEND_TARGET, "sends/s")
    alone, raw_alone = med["cm_alone"], med["raw_outbox_alone"]
    ratio_line("one send per transaction, no relay running", alone, raw_alone, None, "sends/s")
    added = med["session_added_p50_ms"]
    print(
        f"send(session=...): the caller's transaction p50 {med['session_with_p50_ms']:.3f} ms "
        f"with the send, {med['session_without_p50_ms']:.3f} ms without: adds {added:.3f} ms "
        f"(target < {SESSION_ADDED_TARGET_MS})"
    )
    alone_added = med["session_alone_added_p50_ms"]
    print(f"send(session=...) with no relay running: adds {alone_added:.3f} ms")
    return {
        "session_send_alone_added_p50_ms": round(alone_added, 3),
        "single_send_sends_per_s": round(sends, 1),
        "single_send_raw_outbox_txns_per_s": round(raw, 1),
        "single_send_ratio": round(ratio, 3),
        "single_send_ratio_target": SINGLE_SEND_TARGET,
        "single_send_ok": ratio >= SINGLE_SEND_TARGET,
        "single_send_alone_sends_per_s": round(alone, 1),
        "single_send_alone_raw_outbox_txns_per_s": round(raw_alone, 1),
        "single_send_alone_ratio": round(alone / raw_alone, 3),
        "session_send_txn_p50_ms": round(med["session_with_p50_ms"], 3),
        "session_send_baseline_txn_p50_ms": round(med["session_without_p50_ms"], 3),
        "session_send_added_p50_ms": round(added, 3),
        "session_send_added_target_ms": SESSION_ADDED_TARGET_MS,
        "session_send_ok": added < SESSION_ADDED_TARGET_MS,
    }


def receive_figures(
    o: Options, samples: dict[str, list[float]], med: dict[str, float], acks_written: int
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    # One raw receive baseline: the samples taken next to each mode are the same work.
    raw_rx = statistics.median(v for k, vs in samples.items() if k.startswith("raw_") for v in vs)
    for mode in ("consume", "transaction_read", "consume_sa", "consume_orm"):
        ratio_line(f"receive, {mode}", med[mode], raw_rx, RECEIVE_TARGET, "msg/s")
        figures |= {
            f"receive_{mode}_msgs_per_s": round(med[mode], 1),
            f"receive_{mode}_ratio": round(med[mode] / raw_rx, 3),
        }
    best_mode = max(("consume", "transaction_read"), key=lambda m: med[m])
    best_ratio = med[best_mode] / raw_rx
    figures |= {
        "receive_raw_msgs_per_s": round(raw_rx, 1),
        "receive_best_mode": best_mode,
        "receive_ratio": round(best_ratio, 3),
        "receive_ok": best_ratio >= RECEIVE_TARGET,
        "receive_acks_written": acks_written,
    }
    print(
        f"receive: the faster mode is {best_mode}, ratio {best_ratio:.2f}; COMMIT acks written "
        f"to the receiver's outbox: {acks_written} (ack relay running: {o.ack_relay})"
    )
    return figures


if __name__ == "__main__":
    main()
