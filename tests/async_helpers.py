"""Running async tests: a stalled event loop is a test failure.

The async faces of condmsg promise never to block the caller's event loop. Tests hold them
to it by running under asyncio's debug mode, in which the loop logs every callback (a step
of a task, an I/O callback) that holds it longer than ``loop.slow_callback_duration``;
:func:`run_async` captures those warnings from the ``asyncio`` logger, for the loop's own
thread only, and fails the test with the list of them.

Tests use the standard library only (no pytest plugin): a sync test function calls
``run_async(main())``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: The longest a callback may hold the loop (seconds). Generous for a shared 2-core
#: machine; a blocking database round trip or a pika connect still takes longer.
SLOW_CALLBACK_S = 0.05


class LoopStalled(AssertionError):
    """Something held the event loop longer than the slow-callback limit."""


@dataclass(frozen=True, slots=True)
class Stall:
    """One slow callback as asyncio reported it: what ran, and for how long (seconds)."""

    callback: str
    took_s: float


class _StallRecorder(logging.Handler):
    """Collects asyncio's "Executing <callback> took N seconds" warnings of one thread."""

    def __init__(self, thread_id: int) -> None:
        super().__init__(level=logging.WARNING)
        self.thread_id = thread_id
        self.stalls: list[Stall] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread_id or not str(record.msg).startswith("Executing "):
            return
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) == 2 and isinstance(args[1], float):
            self.stalls.append(Stall(callback=str(args[0]), took_s=args[1]))
        else:
            self.stalls.append(Stall(callback=record.getMessage(), took_s=float("nan")))


def run_async(
    main: Coroutine[Any, Any, T],
    *,
    slow_callback_s: float = SLOW_CALLBACK_S,
    ignore: Callable[[Stall], bool] | None = None,
) -> T:
    """Run ``main`` on a new event loop in debug mode and return its result; raise
    :class:`LoopStalled` if any callback held the loop longer than ``slow_callback_s``
    (those ``ignore`` accepts aside: a test's own deliberate blocking, say).

    An exception from ``main`` is raised as it is (stalls are then not checked: the
    failure that matters is the first one)."""
    recorder = _StallRecorder(threading.get_ident())
    logger = logging.getLogger("asyncio")
    old_level = logger.level
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(recorder)

    async def checked() -> T:
        asyncio.get_running_loop().slow_callback_duration = slow_callback_s
        return await main

    # A full collection of what earlier tests left would otherwise land in some callback
    # of this loop and be taken for a stall of the code under test.
    gc.collect()
    try:
        result = asyncio.run(checked(), debug=True)
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(old_level)
    stalls = [s for s in recorder.stalls if ignore is None or not ignore(s)]
    if stalls:
        listed = "; ".join(f"{s.callback} took {s.took_s * 1000:.0f} ms" for s in stalls)
        raise LoopStalled(
            f"the event loop was held longer than {slow_callback_s * 1000:.0f} ms "
            f"{len(stalls)} time(s): {listed}"
        )
    return result


async def asgi_request(
    app: Callable[..., Any], method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    """Call an ASGI ``app`` in-process, on the running loop: (status, body) of one HTTP
    request (``path`` may carry a query string)."""
    route, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    received = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:  # the request is whole: what follows is the client going away
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)
