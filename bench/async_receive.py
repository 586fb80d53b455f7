"""Async transactional receive from one event loop (PostgreSQL + RabbitMQ).

``--messages`` (2,000) signed copies are consumed transactionally, the app writing one row
per message in the receiver's transaction, three ways on the same database and broker:

- ``AsyncReceiver.consume`` with an async handler (the figure);
- the sync ``Receiver.consume`` (target: the async throughput at least 0.9 of it);
- a raw async building block: an aio-pika consumer, one psycopg ``AsyncConnection``
  transaction (the app's row) and one ``basic.ack`` per message (no target: the floor of
  what any async receive costs, with no RLOG, no ack row and no checks).

While the async receiver consumes, every callback the loop runs is timed: the longest is
the longest stall of the event loop (target: at most 5 ms).

Run: ``python -m bench.async_receive [--messages N]`` (env ``CONDMSG_BENCH_PG_URL``,
``CONDMSG_AMQP_URL``). The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pika
import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ackd import AsyncReceiver, Message, Receiver
from ackd.receiver_store import ReceiverStore, SqlAlchemyReceiverStore
from bench._common import emit_result, fresh_pg_schema, log, psycopg_conninfo, row
from bench.async_send import LongestCallback
from condmsg import Destination
from condmsg.core import protocol
from condmsg.runtime.topology import destination_arguments
from condmsg.sending.copies import plan_copies

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
SECRET = b"bench-async-receive-secret-0123456789ab"
PREFETCH = 50
TARGET_RATIO = 0.9
TARGET_STALL_MS = 5.0
APP_INSERT = "INSERT INTO bench_app (cm_id, body) VALUES (%s, %s)"
APP_INSERT_SA = sa.text("INSERT INTO bench_app (cm_id, body) VALUES (:cm_id, :body)")


def fill(queue: str, n: int) -> None:
    """``n`` signed copies of CMs for ``queue`` alone, published as the relay would."""
    with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments=destination_arguments("classic"))
        for _ in range(n):
            (plan,) = plan_copies(
                cm_id=str(uuid.uuid4()),
                condition=Destination(queue, pickup_within=timedelta(minutes=30)),
                sender="bench",
                sent_at=datetime.now(UTC),
                secret=SECRET,
                body=b"x" * 200,
                content_type="application/octet-stream",
                app_headers={},
                part_bytes=1 << 20,
            )
            for m in plan.messages:
                channel.basic_publish(
                    m.exchange,
                    m.routing_key,
                    m.body,
                    pika.BasicProperties(
                        message_id=m.message_id,
                        correlation_id=m.correlation_id,
                        reply_to=m.reply_to,
                        content_type=m.content_type,
                        headers=dict(m.headers or {}),  # type: ignore[arg-type]
                        priority=m.priority,
                        delivery_mode=2,
                    ),
                )


def sync_rate(db_url: str, queue: str, n: int, store: ReceiverStore | None = None) -> float:
    """Messages per second of the sync receiver's transactional consume (its default
    store adapter, or ``store``)."""

    def handler(message: Message, session: Session | None) -> None:
        assert session is not None
        session.execute(APP_INSERT_SA, {"cm_id": message.cm_id, "body": message.body})

    receiver = Receiver(
        amqp_url=AMQP_URL,
        db_url=db_url,
        recipient="bench",
        secret=SECRET,
        create_schema=True,
        store=store,
    )
    try:
        started = time.perf_counter()
        got = receiver.consume(queue, handler, prefetch=PREFETCH, max_messages=n)
        elapsed = time.perf_counter() - started
    finally:
        receiver.close()
        receiver.engine.dispose()
    if got != n:
        raise RuntimeError(f"Receiver.consume handled {got}/{n}")
    return n / elapsed


async def async_rate(db_url: str, queue: str, n: int) -> tuple[float, float]:
    """(messages per second, the longest callback in ms) of the async receiver."""

    async def handler(message: Message, session: AsyncSession | None) -> None:
        assert session is not None
        await session.execute(APP_INSERT_SA, {"cm_id": message.cm_id, "body": message.body})

    async with AsyncReceiver(
        amqp_url=AMQP_URL, db_url=db_url, recipient="bench", secret=SECRET
    ) as receiver:
        # What the process holds after its start is no garbage (see bench.async_send).
        gc.collect()
        gc.freeze()
        with LongestCallback() as callbacks:
            started = time.perf_counter()
            got = await receiver.consume(queue, handler, prefetch=PREFETCH, max_messages=n)
            elapsed = time.perf_counter() - started
    if got != n:
        raise RuntimeError(f"AsyncReceiver.consume handled {got}/{n}")
    return n / elapsed, callbacks.longest_s * 1000


async def raw_rate(db_url: str, queue: str, n: int) -> float:
    """Messages per second of an aio-pika consumer committing one row per message with
    psycopg's AsyncConnection, then acking it."""
    db = await psycopg.AsyncConnection.connect(psycopg_conninfo(db_url), autocommit=True)
    connection = await aio_pika.connect(AMQP_URL)
    got = 0
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        source = await channel.get_queue(queue)
        started = time.perf_counter()
        async with source.iterator() as messages:
            async for message in messages:
                cm_id = (message.headers or {}).get(protocol.H_CM_ID)
                async with db.transaction():
                    await db.execute(APP_INSERT, (cm_id, message.body))
                await message.ack()
                got += 1
                if got == n:
                    break
        elapsed = time.perf_counter() - started
    finally:
        await connection.close()
        await db.close()
    if got != n:
        raise RuntimeError(f"raw async consumer got {got}/{n}")
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per series")
    args = parser.parse_args()
    n = args.messages
    queue = f"bench.async-receive.{uuid.uuid4().hex[:8]}.q"
    try:
        with fresh_pg_schema(PG_URL, "bench_arx") as db_url:
            engine = sa.create_engine(db_url)
            with engine.begin() as conn:
                conn.execute(sa.text("CREATE TABLE bench_app (cm_id text, body bytea)"))
            engine.dispose()
            fill(queue, n)
            sync = sync_rate(db_url, queue, n)
            log(f"sync Receiver.consume: {sync:,.0f} messages/s")
            fill(queue, n)
            plain = sync_rate(db_url, queue, n, SqlAlchemyReceiverStore())
            log(f"sync Receiver.consume, portable store adapter: {plain:,.0f} messages/s")
            fill(queue, n)
            rate, stall_ms = asyncio.run(async_rate(db_url, queue, n))
            log(f"AsyncReceiver.consume: {rate:,.0f} messages/s, longest stall {stall_ms:.1f} ms")
            fill(queue, n)
            raw = asyncio.run(raw_rate(db_url, queue, n))
            log(f"raw aio-pika + psycopg async: {raw:,.0f} messages/s")
    finally:
        with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as connection:
            connection.channel().queue_delete(queue)
    print(
        f"{n} transactional receives: AsyncReceiver {rate:,.0f} messages/s; sync Receiver "
        f"{sync:,.0f} (ratio {rate / sync:.2f}, target >= {TARGET_RATIO}); sync Receiver on "
        f"the portable store adapter, the async one's SQL, {plain:,.0f} (ratio "
        f"{rate / plain:.2f}); raw aio-pika + "
        f"psycopg async {raw:,.0f} (ratio {rate / raw:.2f}); longest event-loop stall "
        f"{stall_ms:.1f} ms (target <= {TARGET_STALL_MS:g} ms)"
    )
    figures: dict[str, Any] = {
        "messages": n,
        "async_messages_per_s": round(rate, 1),
        "sync_messages_per_s": round(sync, 1),
        "raw_async_messages_per_s": round(raw, 1),
        "ratio_to_sync": round(rate / sync, 3),
        "ratio_to_sync_target": TARGET_RATIO,
        "sync_portable_messages_per_s": round(plain, 1),
        "ratio_to_sync_portable": round(rate / plain, 3),
        "ratio_to_raw": round(rate / raw, 3),
        "max_stall_ms": round(stall_ms, 2),
        "max_stall_ok": stall_ms <= TARGET_STALL_MS,
    }
    emit_result(
        "async_receive",
        figures,
        [
            row(
                "async transactional receive vs sync Receiver.consume",
                rate,
                "messages/s",
                baseline=sync,
                ratio_at_least=TARGET_RATIO,
            ),
            row(
                "async transactional receive vs sync, portable store adapter",
                rate,
                "messages/s",
                baseline=plain,
            ),
            row(
                "async transactional receive vs raw aio-pika + psycopg",
                rate,
                "messages/s",
                baseline=raw,
            ),
            row("longest event-loop stall while receiving", stall_ms, "ms", lower=TARGET_STALL_MS),
        ],
    )


if __name__ == "__main__":
    main()
