"""``AsyncReceiver.stream`` on the real RabbitMQ and PostgreSQL / SQLite: the consume loop
as an ``async for``, each item processed in ``async with item:``; every test under the
stall check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

from ackd.tables import poison, rlog
from condmsg.core.errors import ConfigError
from condmsg.core.protocol import MessageKind
from outbox.table import outbox_table
from tests.async_helpers import run_async
from tests.integration.condmsg_helpers import get_all, publish_compensation, publish_original
from tests.integration.receiver.test_async_receiver import (
    _bad_headers,
    _count,
    orders,
    started_receiver,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def test_a_stream_commits_each_item_with_the_apps_rows_and_skips_what_is_not_for_the_app(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> list[tuple[str | None, MessageKind | None]]:
        got: list[tuple[str | None, MessageKind | None]] = []
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            cm_ids = [publish_original(channel, queue) for _ in range(4)]
            channel.basic_publish("", queue, b"x", _bad_headers())
            duplicate = cm_ids[0]
            async with receiver.stream(queue, prefetch=3, idle_timeout_s=0.5) as stream:
                async for item in stream:
                    async with item:
                        await item.session.execute(
                            sa.insert(orders).values(cm_id=item.message.cm_id)
                        )
                        got.append((item.message.cm_id, item.message.kind))
                    assert item.committed
                    if len(got) == 4:
                        publish_compensation(
                            channel,
                            queue=queue,
                            cm_id=duplicate,
                            destination=queue,
                            sender="s",
                            body=b"undo",
                        )
            assert stream.handled == 5
            assert await _count(receiver, orders) == 5
            assert await _count(receiver, rlog) == 4  # one row per CM
            assert await _count(receiver, outbox_table()) == 4  # one COMMIT ack per original
        assert sorted(str(c) for c, k in got if k is MessageKind.ORIGINAL) == sorted(cm_ids)
        assert [c for c, k in got if k is MessageKind.COMPENSATION] == [duplicate]
        return got

    run_async(main())
    assert len(get_all(channel, f"{unique_name}.invalid")) == 1
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_an_item_whose_block_fails_rolls_back_and_comes_again(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            cm_id = publish_original(channel, queue)
            attempts: list[bool] = []
            async with receiver.stream(queue, max_messages=2) as stream:
                async for item in stream:
                    assert item.message.cm_id == cm_id
                    attempts.append(item.message.redelivered)
                    try:
                        async with item:
                            await item.session.execute(sa.insert(orders).values(cm_id=cm_id))
                            if len(attempts) == 1:
                                raise RuntimeError("app failed")
                    except RuntimeError:
                        assert not item.committed
                    else:
                        assert item.committed
                    if item.committed:
                        break
            assert attempts == [False, True]
            assert await _count(receiver, orders) == 1  # the failed attempt's row rolled back
            assert await _count(receiver, poison) == 1  # one failed attempt counted

    run_async(main())


def test_leaving_a_stream_gives_back_what_it_holds_uncounted(
    pg_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    """``break`` with a message in hand but not taken into ``async with item:``, or an
    exception out of the loop: the message goes back uncounted, as the prefetched ones."""
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, pg_url, unique_name, queue) as receiver:
            cm_ids = {publish_original(channel, queue) for _ in range(3)}
            async with receiver.stream(queue, prefetch=3) as stream:
                async for item in stream:
                    assert item.message.cm_id in cm_ids
                    break

            async def skip_every_item() -> None:
                async with receiver.stream(queue) as stream:
                    async for _item in stream:
                        pass  # never processed: the next step refuses

            with pytest.raises(ConfigError, match="before the next"):
                await skip_every_item()
            assert await _count(receiver, poison) == 0
            assert await _count(receiver, rlog) == 0
            seen: set[str | None] = set()
            async with receiver.stream(queue, idle_timeout_s=0.5) as stream:
                async for item in stream:
                    async with item:
                        seen.add(item.message.cm_id)
            assert seen == cm_ids

    run_async(main())


def test_cancelling_inside_an_item_gives_it_back_and_ends_the_stream(
    pg_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, pg_url, unique_name, queue) as receiver:
            cm_id = publish_original(channel, queue)
            in_block = asyncio.Event()

            async def app() -> None:
                async with receiver.stream(queue) as stream:
                    async for item in stream:
                        async with item:
                            await item.session.execute(sa.insert(orders).values(cm_id=cm_id))
                            in_block.set()
                            await asyncio.Event().wait()  # until cancelled

            task = asyncio.create_task(app())
            await asyncio.wait_for(in_block.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await _count(receiver, orders) == 0
            assert await _count(receiver, poison) == 0
            async with receiver.transaction() as tx:
                again = await tx.read(queue, timeout=5)
            assert again is not None and again.cm_id == cm_id

    run_async(main())


def test_a_stream_must_be_entered_and_its_items_processed_once(
    db_url: str, amqp_url: str, unique_name: str, channel: Any
) -> None:
    queue = f"{unique_name}.q"

    async def main() -> None:
        async with started_receiver(amqp_url, db_url, unique_name, queue) as receiver:
            with pytest.raises(ConfigError, match=r"async with receiver\.stream"):
                await anext(aiter(receiver.stream(queue)))
            publish_original(channel, queue)
            async with receiver.stream(queue, max_messages=1) as stream:
                async for item in stream:
                    async with item:
                        pass
                    with pytest.raises(ConfigError, match="processed once"):
                        async with item:
                            pass
            assert await _count(receiver, rlog) == 1

    run_async(main())
