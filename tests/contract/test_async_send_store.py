"""The async sender writes exactly the rows the sync sender writes, on SQLite and PostgreSQL.

The same conditional messages go through :class:`Sender` and :class:`AsyncSender` (plain,
in the caller's transaction, several at once, a sequence, members of a sphere), with the
ids and the clock fixed through their seams; every table a send writes, the outbox's too,
is then compared value for value. On PostgreSQL this holds the sync sender's psycopg fast
path and the async sender's portable path (psycopg's AsyncConnection) to the same rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import outbox
from condmsg import tables
from condmsg.core.conditions import Condition, Destination
from condmsg.sending import copies
from condmsg.sending import sender as sender_module
from condmsg.sending.async_sender import AsyncSender
from condmsg.sending.outgoing import Outgoing
from condmsg.sending.sender import Sender
from condmsg.spheres import sphere as sphere_module
from tests.async_helpers import run_async

pytestmark = pytest.mark.postgres

SENT_AT = datetime(2026, 3, 4, 5, 6, 7, 891000, tzinfo=UTC)
FIVE_S = timedelta(seconds=5)
SECRET = b"contract-secret-of-thirty-two-bytes!"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make CM, sphere and copy ids a fixed sequence; the returned function restarts it."""
    counter = itertools.count()

    def cm_id() -> str:
        return f"00000000-0000-4000-8000-{next(counter):012d}"

    def urandom(n: int) -> bytes:
        return next(counter).to_bytes(n, "big")

    monkeypatch.setattr(sender_module, "new_cm_id", cm_id)
    monkeypatch.setattr(sphere_module, "new_cm_id", cm_id)
    monkeypatch.setattr(copies, "os", SimpleNamespace(urandom=urandom))

    def restart() -> None:
        nonlocal counter
        counter = itertools.count()

    return restart


def batches(example1: Callable[..., Condition]) -> list[tuple[str, list[Outgoing]]]:
    """What each step sends: (how, messages)."""
    q = Destination("qa", pickup_within=FIVE_S)
    return [
        ("plain", [Outgoing(payload={"n": 1}, condition=example1(), notify_success=True)]),
        (
            "session",
            [Outgoing(payload=b"\x00\xff raw", condition=q, compensation={"undo": 1})],
        ),
        (
            "many",
            [
                Outgoing(payload="text", condition=q, headers={"x-app": "7"}),
                Outgoing(payload={"big": "y" * 300}, condition=example1()),  # a sequence
            ],
        ),
        ("sphere", [Outgoing(payload={"member": 1}, condition=q)]),
    ]


def dump(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table a sender writes, autoincrement ids left out, sorted."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    table_list = [*tables.metadata.sorted_tables, outbox.outbox_table(outbox.DEFAULT_TABLE_NAME)]
    with engine.connect() as conn:
        for table in table_list:
            cols = [c for c in table.c if not (c.primary_key and c.autoincrement is True)]
            cols = [c for c in cols if c.name not in ("id", "created_at")]
            rows = conn.execute(sa.select(*cols)).all()
            out[table.name] = sorted((tuple(_plain(v) for v in row) for row in rows), key=repr)
    return out


def _plain(value: Any) -> Any:
    """SQLite hands back naive datetimes (every one stored here is UTC) and memoryviews."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if isinstance(value, memoryview):
        return value.tobytes()
    return value


def wipe(engine: sa.Engine) -> None:
    table_list = [*tables.metadata.sorted_tables, outbox.outbox_table(outbox.DEFAULT_TABLE_NAME)]
    with engine.begin() as conn:
        for table in reversed(table_list):
            if table.name != "condmsg_meta":
                conn.execute(sa.delete(table))


def sync_sends(sender: Sender, steps: list[tuple[str, list[Outgoing]]]) -> None:
    for how, messages in steps:
        if how == "plain":
            sender.send(messages[0].payload, messages[0].condition, notify_success=True)
        elif how == "session":
            with Session(sender.engine) as s, s.begin():
                m = messages[0]
                sender.send(m.payload, m.condition, compensation=m.compensation, session=s)
        elif how == "many":
            sender.send_many(messages)
        else:
            with sender.sphere(timeout=60) as ds:
                ds.send_many(messages)


async def async_sends(sender: AsyncSender, steps: list[tuple[str, list[Outgoing]]]) -> None:
    for how, messages in steps:
        if how == "plain":
            m = messages[0]
            await sender.send(m.payload, m.condition, notify_success=True)
        elif how == "session":
            async with AsyncSession(sender.engine) as s, s.begin():
                m = messages[0]
                await sender.send(m.payload, m.condition, compensation=m.compensation, session=s)
        elif how == "many":
            await sender.send_many(messages)
        else:
            async with sender.sphere(timeout=60) as ds:
                await ds.send_many(messages)


def _with_async(
    store_url: str, amqp_url: str, use: Callable[[AsyncSender], Awaitable[None]]
) -> None:
    async def main() -> None:
        async with AsyncSender(
            amqp_url=amqp_url,
            db_url=store_url,
            name="contract",
            secret=SECRET,
            part_bytes=128,
            clock=lambda: SENT_AT,
            declare_queues=False,
        ) as sender:
            await use(sender)

    run_async(main())


@pytest.fixture
def sync_sender(store_url: str, make_sender: Callable[..., Sender]) -> Sender:
    return make_sender(
        store_url,
        "contract",
        secret=SECRET,
        part_bytes=128,
        clock=lambda: SENT_AT,
        declare_queues=False,
    )


def test_the_async_sender_writes_the_rows_the_sync_sender_writes(
    store_url: str,
    amqp_url: str,
    sync_sender: Sender,
    fixed_ids: Callable[[], None],
    example1: Callable[..., Condition],
) -> None:
    steps = batches(example1)
    sync_sends(sync_sender, steps)
    written = dump(sync_sender.engine)
    assert len(written[tables.cms.name]) == 5 and len(written[outbox.DEFAULT_TABLE_NAME]) >= 5
    wipe(sync_sender.engine)

    fixed_ids()
    _with_async(store_url, amqp_url, lambda sender: async_sends(sender, steps))
    assert dump(sync_sender.engine) == written


def test_a_failed_caller_transaction_writes_nothing(
    store_url: str, amqp_url: str, sync_sender: Sender
) -> None:
    class Boom(Exception):
        pass

    async def fail_inside(sender: AsyncSender) -> None:
        async with AsyncSession(sender.engine) as s, s.begin():
            await sender.send({"n": 1}, Destination("qa", pickup_within=FIVE_S), session=s)
            raise Boom

    with pytest.raises(Boom):
        _with_async(store_url, amqp_url, fail_inside)
    assert all(rows == [] for rows in dump(sync_sender.engine).values())
