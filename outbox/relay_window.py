"""The relay's window: the batches it has published and awaits confirms for, oldest first.

The relay keeps up to ``max_batches_in_flight`` of them, so the broker always has work
while the database settles earlier batches. Publisher confirms may finish batches out of
order (a later batch of a different exchange); each is settled when it is done, and the
confirm timeout is measured on the oldest, which every later batch waits behind.
"""

from __future__ import annotations

import time
from collections import deque

from outbox.metrics import RelayMetrics
from outbox.publish_confirms import PendingBatch
from outbox.store import Claim


class InFlight:
    """The batches awaiting confirms, each with the claim it publishes; see the module
    docstring. Changed by the relay's loop thread only; :attr:`messages` may be read from
    any thread. The ``in_flight`` gauge of ``metrics`` follows it."""

    def __init__(self, metrics: RelayMetrics) -> None:
        self._metrics = metrics
        self._batches: deque[tuple[Claim, PendingBatch]] = deque()

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def messages(self) -> int:
        """Messages awaiting a confirm now."""
        return sum(claim.messages for claim, _ in list(self._batches))

    def add(self, claim: Claim, batch: PendingBatch) -> None:
        """``batch`` publishes ``claim``'s rows."""
        self._batches.append((claim, batch))
        self._metrics.in_flight.inc(claim.messages)

    def finished(self) -> list[tuple[Claim, PendingBatch]]:
        """Take out the batches whose result is final, oldest first, to be settled."""
        # One look at each batch: one finishing meanwhile stays for the next call.
        done: list[tuple[Claim, PendingBatch]] = []
        waiting: deque[tuple[Claim, PendingBatch]] = deque()
        for claim, batch in self._batches:
            (done if batch.done.is_set() else waiting).append((claim, batch))
        self._batches = waiting
        for claim, _ in done:
            self._metrics.in_flight.dec(claim.messages)
        return done

    def overdue(self, limit_s: float) -> bool:
        """Whether the oldest batch has waited longer than ``limit_s`` seconds."""
        return bool(self._batches) and time.monotonic() - self._batches[0][1].submitted_at > limit_s

    def wait_oldest(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for the oldest batch to finish."""
        if self._batches:
            self._batches[0][1].wait(timeout_s)

    def abandon(self) -> list[Claim]:
        """Empty the window (the relay stops): the claims whose rows go back to pending."""
        claims = [claim for claim, _ in self._batches]
        self._batches.clear()
        self._metrics.in_flight.set(0)
        return claims
