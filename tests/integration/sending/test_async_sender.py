"""AsyncSender over the real RabbitMQ and PostgreSQL (and SQLite): the relay run from the
event loop publishes what was sent, the outcome stream, spheres and outcome look-ups; every
test runs under the stall check (tests/async_helpers.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import aio_pika
import pytest
import sqlalchemy as sa
from aio_pika.abc import AbstractChannel

from condmsg import tables
from condmsg.core import protocol
from condmsg.core.conditions import Destination
from condmsg.core.errors import ConfigError, SphereError
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import Outcome
from condmsg.core.timeutil import utcnow
from condmsg.sending.async_sender import AsyncSender
from condmsg.spheres.async_sphere import AsyncSphere
from tests.async_helpers import run_async

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

FIVE_S = timedelta(seconds=5)


def with_sender(
    amqp_url: str,
    db_url: str,
    name: str,
    secret: bytes,
    use: Callable[[AsyncSender, AbstractChannel], Awaitable[Any]],
) -> Any:
    """Run ``use(sender, channel)`` on a started sender and an aio-pika channel."""

    async def main() -> Any:
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel()
            async with AsyncSender(
                amqp_url=amqp_url, db_url=db_url, name=name, secret=secret, create_schema=True
            ) as sender:
                return await use(sender, channel)
        finally:
            await connection.close()

    return run_async(main())


async def next_message(channel: AbstractChannel, queue: str, timeout: float = 10.0) -> Any:
    """The next message of ``queue``, waited for up to ``timeout`` seconds."""
    q = await channel.get_queue(queue, ensure=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = await q.get(fail=False, no_ack=True)
        if message is not None:
            return message
        await asyncio.sleep(0.02)
    raise AssertionError(f"no message on {queue} within {timeout} s")


def test_relaying_from_the_loop_publishes_what_was_sent(
    amqp_url: str, db_url: str, unique_name: str, test_secret: bytes
) -> None:
    queue = f"{unique_name}.q"

    async def use(sender: AsyncSender, channel: AbstractChannel) -> tuple[str, Any]:
        async with sender.relaying():
            cm_id = await sender.send({"n": 1}, Destination(queue, pickup_within=FIVE_S))
            message = await next_message(channel, queue)
        for service in ("ack", "outcome", "dead"):  # declared when the sender started
            await channel.get_queue(f"condmsg.{sender.name}.{service}", ensure=True)
        return cm_id, message

    cm_id, message = with_sender(amqp_url, db_url, unique_name.replace(".", "-"), test_secret, use)
    assert message.headers[protocol.H_CM_ID] == cm_id
    assert message.body == b'{"n":1}'


def test_the_outcome_stream_hands_over_outcomes_and_drops_what_does_not_decode(
    amqp_url: str, pg_url: str, unique_name: str, test_secret: bytes
) -> None:
    now = utcnow()
    outcome = Outcome(
        cm_id="cm-1",
        verdict=Verdict.SATISFIED,
        reasons=("all in",),
        decided_at=now,
        effective_at=now,
        facts=(),
    )

    async def use(sender: AsyncSender, channel: AbstractChannel) -> list[Any]:
        queue = protocol.outcome_queue(sender.name)
        for body in (b"not an outcome", outcome.to_json()):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
        got = [o async for o in sender.outcomes(timeout=1.0)]
        # Each was acknowledged: a second stream finds the queue empty.
        again = [o async for o in sender.outcomes(timeout=0.3)]
        return [got, again]

    got, again = with_sender(amqp_url, pg_url, unique_name.replace(".", "-"), test_secret, use)
    assert got == [outcome]
    assert again == []


async def gives_up(ds: AsyncSphere) -> None:
    async with ds:
        raise RuntimeError("the app gives up")


def test_spheres_commit_on_leaving_abort_on_an_exception_and_do_not_nest(
    amqp_url: str, pg_url: str, unique_name: str, test_secret: bytes
) -> None:
    queue = f"{unique_name}.q"

    async def use(sender: AsyncSender, _channel: AbstractChannel) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with sender.sphere(timeout=60) as ds:
            seen["member"] = await ds.send({"n": 1}, Destination(queue, pickup_within=FIVE_S))
            seen["committed"] = ds.sphere_id
            with pytest.raises(SphereError, match="do not nest"):
                async with sender.sphere(timeout=60):
                    pass
        ds = sender.sphere(timeout=60)
        with pytest.raises(RuntimeError):
            await gives_up(ds)
        seen["aborted"] = ds.sphere_id
        with pytest.raises(SphereError, match="has ended"):
            await ds.send({"n": 2}, Destination(queue, pickup_within=FIVE_S))
        async with sender.engine.connect() as conn:
            rows = await conn.execute(sa.select(tables.spheres.c.sphere_id, tables.spheres.c.state))
            seen["states"] = dict(rows.all())
            cm = await conn.execute(sa.select(tables.cms.c.sphere_id))
            seen["cm_spheres"] = list(cm.scalars())
        seen["pending"] = await sender.outcome(seen["member"], timeout=0.1)
        with pytest.raises(ConfigError, match="unknown conditional message"):
            await sender.outcome("no-such-cm")
        return seen

    seen = with_sender(amqp_url, pg_url, unique_name.replace(".", "-"), test_secret, use)
    assert seen["states"] == {seen["committed"]: "committed", seen["aborted"]: "aborted"}
    assert seen["cm_spheres"] == [seen["committed"]]
    assert seen["pending"] is None
