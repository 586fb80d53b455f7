"""Dependency-Spheres for :class:`~condmsg.sending.async_sender.AsyncSender`: the sync
:class:`~condmsg.spheres.sphere.Sphere`, its steps awaited.

Each step (begin, a handler logged, commit, abort, a look at the outcome) is the sync
sphere's own code, run in a greenlet on the sender's async engine; members are sent with
the async sender. Participants are handlers (``on_success`` / ``on_failure``): prepared
transactions on other databases (``Sphere.transaction``, ``enlist``) hold blocking
connections of their own and stay with the sync sphere.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.util import greenlet_spawn

from condmsg.core.errors import SphereError
from condmsg.core.outcome import SphereOutcome
from condmsg.runtime.async_start import poll
from condmsg.sending.outgoing import Outgoing
from condmsg.spheres.sphere import Sphere

if TYPE_CHECKING:
    from condmsg.sending.sender import Sender


class SphereSender(Protocol):
    """What a sphere uses of its :class:`~condmsg.sending.async_sender.AsyncSender`
    (which makes its spheres, so this module does not import it)."""

    async def _started(self) -> Sender: ...

    async def send_many(
        self,
        messages: Iterable[Outgoing],
        *,
        session: AsyncSession | None = None,
        sphere: str | None = None,
    ) -> list[str]: ...


class AsyncSphere:
    """One Dependency-Sphere of an async sender. ``async with sender.sphere(timeout=...)
    as ds`` begins it; leaving the block commits it, an exception aborts it."""

    def __init__(
        self,
        sender: SphereSender,
        *,
        timeout: timedelta | float | None = None,
        sphere: Sphere | None = None,
    ) -> None:
        self._sender = sender
        self._timeout = timeout
        self._sphere = sphere

    @property
    def sphere_id(self) -> str:
        return self._begun.sphere_id

    @property
    def deadline(self) -> datetime:
        return self._begun.deadline

    @property
    def _begun(self) -> Sphere:
        if self._sphere is None:
            raise SphereError("this sphere has not begun: use it as `async with`")
        return self._sphere

    async def begin(self) -> AsyncSphere:
        """Log the sphere as open in the sender's store (once)."""
        if self._sphere is None:
            core = await self._sender._started()
            self._sphere = await greenlet_spawn(core.begin_sphere, timeout=self._timeout)
        return self

    # -- members and handlers -------------------------------------------------------

    async def send(self, payload: object, condition: Any, **options: Any) -> str:
        """Send one member CM (the arguments of ``AsyncSender.send``); returns its id."""
        session = options.pop("session", None)
        outgoing = Outgoing(payload=payload, condition=condition, **options)
        return (await self.send_many([outgoing], session=session))[0]

    async def send_many(
        self, messages: Iterable[Outgoing], *, session: AsyncSession | None = None
    ) -> list[str]:
        """Send several member CMs in one transaction; refused, with nothing sent, once
        the sphere has ended or its deadline has passed."""
        self._begun._check_open("send through it")
        return await self._sender.send_many(messages, session=session, sphere=self.sphere_id)

    async def on_success(self, handler: str, **args: Any) -> None:
        """Run the registered handler ``handler`` once, with ``args``, if it is satisfied."""
        await greenlet_spawn(self._begun.on_success, handler, **args)

    async def on_failure(self, handler: str, **args: Any) -> None:
        """Run the registered handler ``handler`` once, with ``args``, if it is violated."""
        await greenlet_spawn(self._begun.on_failure, handler, **args)

    # -- ending -----------------------------------------------------------------------

    async def commit(self, *, wait: float = 0.0) -> SphereOutcome | None:
        """Commit (see ``Sphere.commit``); the outcome if known within ``wait`` seconds."""
        await greenlet_spawn(self._begun.commit)
        return await self.outcome(wait)

    async def abort(self, reason: str = "aborted by the sender") -> None:
        """Abort: the sphere is violated, and its members are compensated."""
        await greenlet_spawn(self._begun.abort, reason)

    async def outcome(self, timeout: float = 0.0, *, poll_s: float = 0.05) -> SphereOutcome | None:
        """The sphere's outcome, waiting up to ``timeout`` seconds; None while undecided.
        Once it is known, its handlers run (once)."""
        return await poll(lambda: greenlet_spawn(self._begun.outcome, 0.0), timeout, poll_s)

    async def __aenter__(self) -> AsyncSphere:
        await self.begin()
        self._begun.__enter__()  # the one-sphere-per-block check (a task's context)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sphere = self._begun
        try:
            if sphere.ended is None:
                if exc is None:
                    await self.commit()
                else:
                    await self.abort(f"the sphere's block raised {type(exc).__name__}: {exc}"[:500])
        finally:
            sphere.__exit__(None, None, None)  # leaves the block; ended, so nothing more
