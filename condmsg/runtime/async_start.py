"""Start-up and waiting shared by the asyncio faces (``AsyncSender``, ``AsyncReceiver``).

:class:`AsyncStart` gives a face its life: ``async with face:``, or ``await face.start()``
and ``await face.close()``; the sync core it wraps is built on first need, once, even when
several tasks ask for it at the same time. :func:`poll` waits for a value that only a look
at the store can tell.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, Self, TypeVar

T = TypeVar("T")

__all__ = ["AsyncStart", "poll"]


class AsyncStart(Generic[T]):
    """A face whose core (``T``) is built by :meth:`_build` when first needed.

    Subclasses call ``super().__init__()`` and define :meth:`_build` and :meth:`close`.
    """

    def __init__(self) -> None:
        self._core: T | None = None
        self._starting = asyncio.Lock()

    async def _build(self) -> T:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        """Build the core now (sends and reads build it if this was not called)."""
        await self._started()
        return self

    async def _started(self) -> T:
        if self._core is not None:
            return self._core
        # The lock makes concurrent first callers wait for one build, not start their own.
        async with self._starting:
            if self._core is None:
                self._core = await self._build()
        return self._core

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def poll(look: Callable[[], Awaitable[T | None]], timeout: float, poll_s: float) -> T | None:
    """``await look()`` until it is not None or ``timeout`` seconds have passed (looking
    every ``poll_s`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        found = await look()
        if found is not None or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(poll_s)
