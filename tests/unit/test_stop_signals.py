"""condmsg.runtime.stopping: a signal sets a flag, a thread turns it into an event, and the
handlers replaced are given back."""

from __future__ import annotations

import os
import signal
from types import FrameType

from condmsg.runtime.stopping import StopSignals


def test_a_signal_sets_the_event_and_uninstall_gives_the_handlers_back() -> None:
    seen: list[int] = []

    def before(signum: int, _frame: FrameType | None) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, before)
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        stop = StopSignals().install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.event.wait(5) and stop.signum == signal.SIGTERM
        assert seen == []  # the handler in place was StopSignals'
        stop.uninstall()
        assert signal.getsignal(signal.SIGTERM) is before
        assert signal.getsignal(signal.SIGINT) is interrupt
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
