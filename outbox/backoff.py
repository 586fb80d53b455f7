"""Exponential backoff with jitter, for reconnecting and for re-publishing nacked rows."""

from __future__ import annotations

import random
from dataclasses import dataclass


def retry_delay_s(attempt: int, *, initial_s: float, maximum_s: float) -> float:
    """Delay in seconds before try number ``attempt + 1`` (``attempt`` >= 1), no jitter."""
    return float(min(maximum_s, initial_s * 2 ** max(0, attempt - 1)))


@dataclass(slots=True)
class Backoff:
    """Delays ``initial_s``, doubling up to ``maximum_s``, each shortened by up to 25 %
    at random so that relays restarted together do not reconnect in lock step."""

    initial_s: float = 0.2
    maximum_s: float = 10.0
    attempt: int = 0

    def next_delay(self) -> float:
        self.attempt += 1
        delay = retry_delay_s(self.attempt, initial_s=self.initial_s, maximum_s=self.maximum_s)
        return delay * (0.75 + 0.25 * random.random())

    def reset(self) -> None:
        self.attempt = 0
