"""Stopping a service on SIGTERM or SIGINT without a lock in the signal handler.

Python runs a signal handler in the main thread, between two bytecodes of whatever that
thread was doing. If the handler takes a lock (``threading.Event.set`` does, and so does
anything that notifies a condition) while the interrupted frame holds the same lock (a
main loop inside ``Event.wait``), the process hangs for ever. So the handler here only
assigns an attribute; a watcher thread turns it into an ordinary :class:`threading.Event`
that the rest of the service waits on as usual.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

#: How often the watcher looks at the flag (seconds): the most a stop is delayed by it.
POLL_S = 0.1


class StopSignals:
    """SIGTERM and SIGINT as a :class:`threading.Event` (:attr:`event`), set from a thread
    of its own; the handler itself only assigns :attr:`requested`."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.event = threading.Event()
        self._replaced: dict[int, Any] = {}

    def install(self) -> StopSignals:
        """Handle SIGTERM and SIGINT from now on (call from the main thread)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._replaced[signum] = signal.signal(signum, self._on_signal)
        threading.Thread(target=self._watch, name="stop-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Give SIGTERM and SIGINT back to the handlers :meth:`install` replaced, and end
        the watcher (for a step that stops on a signal inside a longer program)."""
        for signum, handler in self._replaced.items():
            signal.signal(signum, handler)
        self._replaced.clear()
        self.event.set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
        self.requested = True

    def _watch(self) -> None:
        while not self.requested and not self.event.is_set():
            time.sleep(POLL_S)
        self.event.set()
