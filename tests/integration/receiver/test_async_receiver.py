"""AsyncReceiver on the real RabbitMQ and PostgreSQL / SQLite: reads, transactions with the
app's AsyncSession, the consume loop, cancellation; every test under the stall check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.util import greenlet_spawn

from ackd import AsyncReceiver, Message, StoreUnavailable
from ackd.tables import RlogState, poison, rlog
from condmsg.core.protocol import MessageKind
from outbox.table import outbox_table
from tests.async_helpers import run_async
from tests.integration.condmsg_helpers import (
    SECRET,
    copy_messages,
    get_all,
    publish,
    publish_compensation,
    publish_original,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

app_metadata = sa.MetaData()
orders = sa.Table(
    "t_async_orders",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36), nullable=False),
)


def async_receiver(amqp_url: str, db_url: str, unique_name: str, **options: Any) -> AsyncReceiver:
    """An async receiver of the test (its invalid queue the test's own)."""
    options.setdefault("invalid_queue", f"{unique_name}.invalid")
    return AsyncReceiver(
        amqp_url=amqp_url,
        db_url=db_url,
        recipient="alice",
        secret=SECRET,
        create_schema=True,
        **options,
    )


@asynccontextmanager
async def started_receiver(
    amqp_url: str, db_url: str, unique_name: str, queue: str, **options: Any
) -> AsyncIterator[AsyncReceiver]:
    """An async receiver of the test, started, with the app's table and ``queue``."""
    async with async_receiver(amqp_url, db_url, unique_name, **options) as receiver:
        await _started(receiver, queue)
        yield receiver


async def _started(receiver: AsyncReceiver, queue: str) -> None:
    await receiver.start()
    async with receiver.engine.begin() as conn:
        await conn.run_sync(app_metadata.create_all)
    await declare(receiver, queue)


async def declare(receiver: AsyncReceiver, queue: str) -> None:
    """Declare ``queue`` as the receiver declares its queues."""
    core = await receiver._started()
    await greenlet_spawn(core.broker.ensure_queue, queue)


async def _count(receiver: AsyncReceiver, table: sa.Table) -> int:
    async with receiver.engine.connect() as conn:
        return int((await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one())


def test_a_transaction_on_the_apps_async_session_commits_rows_rlog_and_ack(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            cm_id = publish_original(channel, queue)
            session = AsyncSession(receiver.engine)
            async with session, receiver.transaction(session=session) as tx:
                message = await tx.read(queue, timeout=5)
                assert message is not None and message.cm_id == cm_id
                await session.execute(sa.insert(orders).values(cm_id=cm_id))
            assert await _count(receiver, orders) == 1
            assert await _count(receiver, outbox_table()) == 1  # the COMMIT ack
            async with receiver.engine.connect() as conn:
                states = (await conn.execute(sa.select(rlog.c.state))).scalars().all()
            assert states == [RlogState.CONSUMED]
            assert await receiver.read(queue, timeout=0.3) is None  # acked

    run_async(main())


def test_a_failed_transaction_rolls_back_and_the_message_comes_back(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            cm_id = publish_original(channel, queue)

            async def fail() -> None:
                async with receiver.transaction() as tx:
                    assert await tx.read(queue, timeout=5) is not None
                    await tx.session.execute(sa.insert(orders).values(cm_id=cm_id))
                    raise RuntimeError("app failed")

            with pytest.raises(RuntimeError, match="app failed"):
                await fail()
            assert await _count(receiver, orders) == 0
            assert await _count(receiver, outbox_table()) == 0
            assert await _count(receiver, poison) == 1  # one failed attempt counted
            async with receiver.transaction() as tx:  # back after its backoff (200 ms)
                again = await tx.read(queue, timeout=5)
            assert again is not None and again.cm_id == cm_id and again.redelivered

    run_async(main())


def test_a_non_transactional_read_writes_its_read_ack_first(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            assert await receiver.read(queue, timeout=0.2) is None
            cm_id = publish_original(channel, queue)
            message = await receiver.read(queue, timeout=5)
            assert message is not None and message.cm_id == cm_id
            assert await _count(receiver, outbox_table()) == 1

    run_async(main())


def test_consume_hands_each_message_once_and_moves_the_invalid_one(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"
    cm_ids: list[str] = []

    async def main() -> list[tuple[str | None, MessageKind | None]]:
        got: list[tuple[str | None, MessageKind | None]] = []

        async def handler(message: Message, session: AsyncSession | None) -> None:
            assert session is not None
            await session.execute(sa.insert(orders).values(cm_id=message.cm_id))
            await asyncio.sleep(0)  # the app's own awaits
            got.append((message.cm_id, message.kind))
            if len(got) == 5:
                publish_compensation(
                    channel,
                    queue=queue,
                    cm_id=cm_ids[0],
                    destination=queue,
                    sender="s",
                    body=b"undo",
                )

        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            cm_ids.extend(publish_original(channel, queue) for _ in range(5))
            channel.basic_publish("", queue, b"x", _bad_headers())
            handled = await receiver.consume(queue, handler, max_messages=6, prefetch=4)
            assert handled == 6
            assert await _count(receiver, orders) == 6
        return got

    got = run_async(main())
    assert sorted(str(c) for c, k in got if k is MessageKind.ORIGINAL) == sorted(cm_ids)
    assert [c for c, k in got if k is MessageKind.COMPENSATION] == [cm_ids[0]]
    invalid = get_all(channel, f"{unique_name}.invalid")
    assert len(invalid) == 1
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_cancelling_consume_gives_the_message_in_hand_back_uncounted(
    pg_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        in_handler = asyncio.Event()

        async def handler(message: Message, session: AsyncSession | None) -> None:
            assert session is not None
            await session.execute(sa.insert(orders).values(cm_id=message.cm_id))
            in_handler.set()
            await asyncio.Event().wait()  # until cancelled

        async with started_receiver(amqp_url, pg_url, unique_name, queue) as receiver:
            cm_id = publish_original(channel, queue)
            task = asyncio.create_task(receiver.consume(queue, handler))
            await asyncio.wait_for(in_handler.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await _count(receiver, orders) == 0
            assert await _count(receiver, poison) == 0  # not the message's fault
            async with receiver.transaction() as tx:
                again = await tx.read(queue, timeout=5)
            assert again is not None and again.cm_id == cm_id

    run_async(main())


def _bad_headers() -> Any:
    import pika

    from condmsg.core import protocol

    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: "gossip",
    }
    return pika.BasicProperties(headers=headers, message_id="bad-1")


SIGTERM_APP = """
import asyncio, signal, sys
import sqlalchemy as sa
from ackd import AsyncReceiver

async def main(amqp_url, db_url, queue, invalid_queue):
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def handler(message, session):
        await session.execute(
            sa.text("INSERT INTO t_async_orders (cm_id) VALUES (:c)"), {"c": message.cm_id}
        )
        print("handling", flush=True)
        await asyncio.sleep(0.3)  # the app's work, during which SIGTERM comes

    async with AsyncReceiver(
        amqp_url=amqp_url, db_url=db_url, recipient="alice", invalid_queue=invalid_queue
    ) as receiver:
        handled = await receiver.consume(queue, handler, prefetch=10, stop=stop)
    print("handled", handled, flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


def test_sigterm_ends_consume_after_the_message_in_hand_commits(
    pg_url: str, amqp_url: str, unique_name: str, channel: Any, tmp_path: Any
) -> None:
    """An app that sets ``stop`` on SIGTERM: the message in hand commits, the prefetched
    ones go back to the queue, and the process ends on its own."""
    import subprocess
    import sys
    from pathlib import Path

    queue = f"{unique_name}.q"

    async def prepare() -> None:
        async with started_receiver(amqp_url, pg_url, unique_name, queue):
            pass  # started: the app table and the queue exist

    run_async(prepare())
    cm_ids = [publish_original(channel, queue) for _ in range(8)]
    script = tmp_path / "app.py"
    script.write_text(SIGTERM_APP)
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, str(script), amqp_url, pg_url, queue, f"{unique_name}.invalid"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"handling"
        proc.send_signal(15)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
    handled = int(out.decode().split("handled")[-1])
    assert handled >= 1
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one()
        consumed = conn.execute(sa.select(sa.func.count()).select_from(rlog)).scalar_one()
    engine.dispose()
    assert rows == consumed == handled  # each handled message committed, nothing else
    # Everything not handled is back in the queue, ready for the next consumer.
    left = channel.queue_declare(queue, passive=True).method.message_count
    assert left == len(cm_ids) - handled


def test_a_transaction_that_cannot_reach_the_store_says_so(
    pg_url: str, amqp_url: str, unique_name: str, store_proxy: Any
) -> None:
    """As the sync receiver's: ``StoreUnavailable``, whether the kept connection is lost
    under the transaction or no connection can be opened; a new one once the store is
    back."""

    async def select_one(receiver: AsyncReceiver) -> int:
        async with receiver.transaction() as tx:
            return int((await tx.session.execute(sa.text("SELECT 1"))).scalar_one())

    async def main() -> None:
        async with async_receiver(amqp_url, store_proxy.url(pg_url), unique_name) as receiver:
            assert await select_one(receiver) == 1
            # In a thread: taking the proxy down joins its accept loop (up to 0.1 s).
            await asyncio.to_thread(store_proxy.down)
            for _ in range(2):
                with pytest.raises(StoreUnavailable, match="cannot be reached"):
                    await select_one(receiver)
            store_proxy.up()
            assert await select_one(receiver) == 1

    run_async(main())


def test_concurrent_transactions_of_one_receiver(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    """Tasks of one loop (requests of one app) may each run a transaction on the same
    receiver: each takes its own message and commits its own rows."""
    queue = f"{unique_name}.q"

    async def main() -> list[str]:
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            cm_ids = [publish_original(channel, queue) for _ in range(6)]

            async def one() -> str:
                async with receiver.transaction() as tx:
                    message = await tx.read(queue, timeout=5)
                    assert message is not None
                    await tx.session.execute(sa.insert(orders).values(cm_id=message.cm_id))
                    await asyncio.sleep(0.01)  # the others run meanwhile
                    return str(message.cm_id)

            got = await asyncio.gather(*(one() for _ in cm_ids))
            assert await _count(receiver, orders) == len(cm_ids)
            assert await _count(receiver, rlog) == len(cm_ids)
            assert sorted(got) == sorted(cm_ids)
            return got

    run_async(main())


def test_consume_dead_letters_a_poison_message_and_reassembles_a_sequence(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    """Failed attempts are counted and the message moves to the invalid queue after
    ``max_attempts``, while a Message Sequence's parts are stored and the whole handed
    over once, from the store."""
    queue = f"{unique_name}.q"
    body = bytes(range(256)) * 13  # three parts of 1 KiB and a rest

    async def main() -> list[bytes]:
        got: list[bytes] = []

        async def handler(message: Message, session: AsyncSession | None) -> None:
            if message.payload == b"poison":
                raise ValueError("cannot handle this one")
            got.append(message.payload)

        async with started_receiver(
            amqp_url, db_url, unique_name, queue, max_attempts=2, retry_backoff=timedelta(0)
        ) as receiver:
            publish_original(channel, queue, body=b"poison")
            for part in copy_messages(queue, body, part_bytes=1024):
                publish(channel, part)
            handled = await receiver.consume(queue, handler, idle_timeout_s=1.0)
            assert handled == 1
            assert receiver.stats.parts == 4
        return got

    assert run_async(main()) == [body]
    ((props, moved),) = get_all(channel, f"{unique_name}.invalid")
    assert moved == b"poison"
    assert "poison message: processing failed 2 times" in props.headers["condmsg-reason"]
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_consume_waits_for_a_broker_that_is_down_at_its_start(
    sqlite_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    """No connection yet is an outage like any other: consume waits and starts when
    RabbitMQ answers (invariant 8: no exit because a connection attempt failed)."""
    from tests.integration.tcp_proxy import TcpProxy

    queue = f"{unique_name}.q"
    proxy = TcpProxy()  # not listening: connections are refused

    async def main() -> int:
        got = asyncio.Event()

        async def handler(message: Message, session: AsyncSession | None) -> None:
            got.set()

        async with (
            async_receiver(proxy.url(amqp_url), sqlite_url, unique_name) as receiver,
            async_receiver(amqp_url, sqlite_url, unique_name) as declarer,
        ):
            await _started(declarer, queue)
            stop = asyncio.Event()
            task = asyncio.create_task(receiver.consume(queue, handler, stop=stop))
            await asyncio.sleep(0.5)  # refused meanwhile: the consumer keeps trying
            assert not task.done()
            proxy.up()
            publish_original(channel, queue)
            await asyncio.wait_for(got.wait(), 30)
            stop.set()
            return await task

    try:
        assert run_async(main()) == 1
    finally:
        proxy.close()
