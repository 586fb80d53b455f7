"""Group commit for the async sender: sends awaited at the same time share a transaction.

An event loop may have hundreds of sends in flight at once (one per request). Each in a
transaction of its own costs a connection and a commit apiece; instead, the sends that
arrive while a write is in flight wait for the next one, which writes all of their rows
as one batch (the rows :meth:`Sender.send_many` would write for them), and each caller
resumes when the batch's transaction has committed. A lone send is written at once.

A batch is all or nothing: if its transaction fails (the store went away, say), every
send in it raises that error and none of them was recorded, as if each had failed alone.
Sends in the caller's transaction or in a sphere never come here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from condmsg.sending.send_rows import SendRows

#: The most CMs one transaction takes (a bigger backlog is written in several): the
#: statements of a batch are built on the event loop, between two awaits, so a batch stays
#: small enough for that to take a few milliseconds at most.
MAX_BATCH_CMS = 50


class GroupCommit:
    """Writes the rows of concurrent sends through ``write`` (one transaction per call),
    batched; at most ``writers`` transactions at a time."""

    def __init__(self, write: Callable[[SendRows], Awaitable[None]], *, writers: int = 2) -> None:
        self._write = write
        self._writers = writers
        self._active = 0
        self._waiting: list[tuple[SendRows, asyncio.Future[None]]] = []

    async def add(self, rows: SendRows) -> None:
        """Return once ``rows`` are committed (raise what their transaction raised)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((rows, done))
        if self._active < self._writers:
            self._active += 1
            asyncio.get_running_loop().create_task(self._drain())
        await done

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = self._take()
                merged = SendRows()
                for rows, _ in batch:
                    merged.extend(rows)
                try:
                    await self._write(merged)
                except BaseException as exc:  # handed to every send of the batch
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for _, done in batch:
                        if not done.done():
                            done.set_result(None)
        finally:
            self._active -= 1

    def _take(self) -> list[tuple[SendRows, asyncio.Future[None]]]:
        """The oldest waiting sends, up to :data:`MAX_BATCH_CMS` CMs (at least one send)."""
        count, taken = 0, 0
        for rows, _ in self._waiting:
            if taken and count + len(rows.cms) > MAX_BATCH_CMS:
                break
            count += len(rows.cms)
            taken += 1
        batch, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return batch
