"""``AsyncSender``: the :class:`~condmsg.sending.sender.Sender` for asyncio applications.

Nothing here decides what a send writes. The rows come from the sync sender's own code
(:meth:`Sender.prepare`) and go through its own store code (:meth:`Sender.write`, the
:class:`~condmsg.sending.send_rows.SendStore` adapters), run on SQLAlchemy's asyncio
extension: the sync code runs in a greenlet (``AsyncSession.run_sync``, ``greenlet_spawn``)
and each database round trip in it is an ``await`` on the async driver (psycopg's
``AsyncConnection``, aiosqlite), so the event loop serves other tasks meanwhile. No thread,
no second SQL. On such a connection the store's portable adapter applies (the psycopg fast
path needs psycopg's blocking connection: :func:`condmsg.infra.backends.uses_psycopg`).

The queue declarations go through aio-pika (:mod:`condmsg.sending.async_broker`), once per
queue; the outcome stream too (:mod:`condmsg.sending.async_outcomes`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.util import greenlet_spawn

from condmsg.core.conditions import Condition
from condmsg.core.errors import ConfigError, StoreError
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.core.timeutil import utcnow
from condmsg.runtime.async_start import AsyncStart, poll
from condmsg.runtime.db import SQLITE_BUSY_TIMEOUT_MS, configure_sqlite, make_engine
from condmsg.runtime.relaying import relay_for
from condmsg.runtime.settings import DEFAULT_QUEUE_TYPE
from condmsg.sending.async_broker import AsyncDeclarer
from condmsg.sending.async_outcomes import async_outcome_notifications
from condmsg.sending.group_commit import GroupCommit
from condmsg.sending.outgoing import Outgoing
from condmsg.sending.send_rows import SendRows
from condmsg.sending.sender import (
    DEFAULT_PART_BYTES,
    Sender,
    checked_arguments,
    options_from_env,
)
from condmsg.spheres.async_sphere import AsyncSphere
from condmsg.spheres.resolution import Handler
from outbox.relay import Relay

__all__ = ["AsyncSender", "make_async_engine"]


def make_async_engine(url: str) -> AsyncEngine:
    """An async engine for a store URL as the sync sender takes it (``sqlite:///path.db``,
    ``postgresql+psycopg://...``): aiosqlite for SQLite, psycopg's async connection for
    PostgreSQL, with the connection settings the sync engines have."""
    try:
        parsed = make_url(url)
    except Exception:
        raise StoreError("invalid database URL (it does not parse)") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engine = create_async_engine(
            parsed.set(drivername="sqlite+aiosqlite"),
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        )
        configure_sqlite(engine.sync_engine)
        return engine
    if backend == "postgresql":
        return create_async_engine(parsed.set(drivername="postgresql+psycopg"), pool_pre_ping=True)
    raise ConfigError(f"the async sender needs SQLite or PostgreSQL, not {backend}")


class AsyncSender(AsyncStart[Sender]):
    """The sending side of conditional messaging for an asyncio application; the
    arguments and rows of :class:`~condmsg.sending.sender.Sender`, every call awaitable.

    Use it as ``async with AsyncSender(...) as sender:`` (or ``await sender.start()`` and
    ``await sender.close()``, say in an ASGI lifespan): starting checks the store's schema,
    reads its secret and declares the sender's queues, without blocking the loop.
    ``engine`` is an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` on the store (else one is
    made from ``db_url``); ``send(session=...)`` takes an ``AsyncSession`` on it.
    """

    def __init__(
        self,
        *,
        amqp_url: str,
        db_url: str | None = None,
        name: str,
        engine: AsyncEngine | None = None,
        secret: bytes | None = None,
        part_bytes: int = DEFAULT_PART_BYTES,
        clock: Callable[[], datetime] = utcnow,
        declare_queues: bool = True,
        create_schema: bool = False,
        destination_queue_type: str = DEFAULT_QUEUE_TYPE,
    ) -> None:
        super().__init__()
        self.name = checked_arguments(
            "AsyncSender", name, engine is not None or db_url is not None, destination_queue_type
        )
        self.amqp_url = amqp_url
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else make_async_engine(str(db_url))
        self._core_options: dict[str, Any] = {
            "secret": secret,
            "part_bytes": part_bytes,
            "clock": clock,
            "create_schema": create_schema,
            "destination_queue_type": destination_queue_type,
        }
        self._declare = declare_queues
        self._declarer = AsyncDeclarer(amqp_url, name, destination_queue_type)
        self._handlers: dict[str, Handler] = {}
        self._group = GroupCommit(self._write_own)

    @classmethod
    def from_env(cls, *, name: str, **overrides: Any) -> AsyncSender:
        return cls(name=name, **options_from_env(overrides))

    # -- life ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the broker connection, and the engine if the sender made it."""
        await self._declarer.close()
        if self._owns_engine:
            await self.engine.dispose()

    async def _build(self) -> Sender:
        """Check the store, read its secret and declare the sender's queues."""
        # The sync sender, built on the async engine's sync facade inside a greenlet: its
        # schema check and secret read await the async driver.
        core = await greenlet_spawn(
            Sender,
            amqp_url=self.amqp_url,
            engine=self.engine.sync_engine,
            name=self.name,
            declare_queues=False,
            **self._core_options,
        )
        for handler_name, handler in self._handlers.items():
            core.register_handler(handler_name, handler)
        if self._declare:
            await self._declarer.service_queues()
        return core

    def clock(self) -> datetime:
        """The sender's clock (``sent_at`` of its CMs, the instants of its spheres)."""
        clock: Callable[[], datetime] = self._core_options["clock"]
        return clock()

    # -- sending --------------------------------------------------------------------

    async def send(
        self,
        payload: object,
        condition: Condition,
        *,
        compensation: object | None = None,
        notify_success: bool = False,
        session: AsyncSession | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        """:meth:`Sender.send`, awaitable; ``session`` is the caller's ``AsyncSession`` on
        this sender's database: the send joins its transaction and is published only if
        that transaction commits."""
        outgoing = Outgoing(
            payload=payload,
            condition=condition,
            compensation=compensation,
            notify_success=notify_success,
            headers=headers,
            content_type=content_type,
        )
        return (await self.send_many([outgoing], session=session))[0]

    async def send_many(
        self,
        messages: Iterable[Outgoing],
        *,
        session: AsyncSession | None = None,
        sphere: str | None = None,
    ) -> list[str]:
        """:meth:`Sender.send_many`, awaitable: all or nothing, in ``session``'s
        transaction if given. Else in a transaction shared with the sends awaited at the
        same time (:mod:`~condmsg.sending.group_commit`): returns once it has committed."""
        core = await self._started()
        rows = core.prepare(messages, sphere=sphere)
        if not rows.cms:
            return []
        if self._declare:
            await self._declarer.destinations(rows.queues())
        if session is None and sphere is None:
            await self._group.add(rows)
        elif session is None:
            await greenlet_spawn(core.write, rows, sphere=sphere)
        else:
            await session.run_sync(lambda s: core.write(rows, session=s, sphere=sphere))
        return rows.cm_ids()

    async def _write_own(self, rows: SendRows) -> None:
        """Write ``rows`` in a transaction of their own."""
        await greenlet_spawn((await self._started()).write, rows)

    # -- outcomes -----------------------------------------------------------------------

    async def outcome(
        self, cm_id: str, timeout: float = 0.0, *, poll_s: float = 0.05
    ) -> Outcome | None:
        """:meth:`Sender.outcome`, awaitable: the decided outcome of ``cm_id`` from the
        store, waiting up to ``timeout`` seconds; None if it is still pending then."""
        core = await self._started()
        return await poll(lambda: greenlet_spawn(core.outcome, cm_id, 0.0), timeout, poll_s)

    def outcomes(self, *, timeout: float | None = None) -> AsyncIterator[Outcome | SphereOutcome]:
        """:meth:`Sender.outcomes` as an async iterator (``async for outcome in ...``):
        each notification acknowledged once the loop asks for the next, a broker outage
        waited out, the stream ended after ``timeout`` seconds without one (None: never)."""
        return async_outcome_notifications(self.amqp_url, self.name, timeout)

    # -- Dependency-Spheres (docs/spheres.md) --------------------------------------------

    def sphere(self, *, timeout: timedelta | float | None = None) -> AsyncSphere:
        """A Dependency-Sphere to use as ``async with sender.sphere(timeout=...) as ds``:
        begun on entering, committed on leaving, aborted by an exception."""
        return AsyncSphere(self, timeout=timeout)

    async def begin_sphere(self, *, timeout: timedelta | float | None = None) -> AsyncSphere:
        """Begin a sphere to end later with ``await ds.commit()`` or ``await ds.abort()``."""
        return await AsyncSphere(self, timeout=timeout).begin()

    async def sphere_by_id(self, sphere_id: str) -> AsyncSphere:
        """Reattach to a sphere of this sender (from another process, after a restart)."""
        core = await self._started()
        return AsyncSphere(self, sphere=await greenlet_spawn(core.sphere_by_id, sphere_id))

    def register_handler(self, name: str, handler: Handler) -> None:
        """:meth:`Sender.register_handler`: ``handler(session, **args)`` gets a sync
        ``Session`` on this sender's store (its statements await the async driver)."""
        self._handlers[name] = handler
        if self._core is not None:
            self._core.register_handler(name, handler)

    async def resolve_spheres(self, *, limit: int = 100) -> int:
        """:meth:`Sender.resolve_spheres` for spheres whose participants are handlers."""
        core = await self._started()
        return await greenlet_spawn(core.resolve_spheres, limit=limit)

    async def sphere_outcome(
        self, sphere_id: str, timeout: float = 0.0, *, poll_s: float = 0.05
    ) -> SphereOutcome | None:
        """The outcome of a sphere of this sender, waiting up to ``timeout`` seconds."""
        core = await self._started()
        return await poll(
            lambda: greenlet_spawn(core.sphere_outcome, sphere_id, 0.0), timeout, poll_s
        )

    # -- relaying -----------------------------------------------------------------------

    @asynccontextmanager
    async def relaying(self, **settings: Any) -> AsyncIterator[Relay]:
        """Run this store's outbox relay for the block: the sync sender's relay
        (:meth:`Sender.relay`), in the worker thread it owns, on a sync engine of its own;
        starting and stopping it are awaited off the loop. ``settings``:
        :class:`outbox.RelayConfig` fields."""
        core = await self._started()
        url = self.engine.url
        sync_url = url.set(
            drivername="sqlite" if url.get_backend_name() == "sqlite" else "postgresql+psycopg"
        ).render_as_string(hide_password=False)
        engine = make_engine(sync_url)
        try:
            relay = await asyncio.to_thread(
                relay_for, engine, self.amqp_url, core._relay_name, **settings
            )
            await asyncio.to_thread(relay.start)
            try:
                yield relay
            finally:
                await asyncio.to_thread(relay.stop)
        finally:
            await asyncio.to_thread(engine.dispose)
