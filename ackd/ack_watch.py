"""Whether a receiver's acks leave its store.

A receiver's acks are rows of its store's outbox; only a relay publishes them (the
receiver's own ``start_relay()`` or ``condmsg relay`` on its store). Without one they wait
there, and the evaluator decides the CMs they acknowledge violated at their deadlines. The
receiver cannot see a relay, but it can see what one would have taken: acks that have waited
longer than a relay ever lets them. :class:`AckWatch` looks at start and then every
``every_s`` seconds of reading, warns once when acks are stuck (and once when they move
again), and keeps the figures in ``ReceiverStats`` and, given a registry, in two gauges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy.engine import Engine

from outbox.store import OutboxStatus, OutboxStore

log = logging.getLogger(__name__)

#: Acks older than this have not met a relay: a running relay publishes within a second.
STALE_AFTER_S = 30.0
#: How often reading looks again (one small indexed query).
EVERY_S = 15.0


class AckWatch:
    def __init__(
        self,
        engine: Engine,
        *,
        store_name: str,
        registry: CollectorRegistry | None = None,
        stale_after_s: float = STALE_AFTER_S,
        every_s: float = EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._outbox = OutboxStore(engine)
        self._store_name = store_name
        self._stale_after_s = stale_after_s
        self._every_s = every_s
        self._monotonic = monotonic
        self._next = 0.0
        self.stuck = False
        self.last: OutboxStatus | None = None
        self._pending: Gauge | None = None
        self._oldest: Gauge | None = None
        if registry is not None:
            self._pending = Gauge(
                "condmsg_receiver_outbox_pending_acks",
                "Acks of this receiver waiting in its store's outbox for a relay",
                registry=registry,
            )
            self._oldest = Gauge(
                "condmsg_receiver_outbox_oldest_ack_age_seconds",
                "Age of the oldest ack waiting in this receiver's outbox (0: none)",
                registry=registry,
            )

    def check(self, *, now: bool = False) -> OutboxStatus | None:
        """Look at the outbox if it is time (or ``now``); the status seen, else None."""
        at = self._monotonic()
        if not now and at < self._next:
            return None
        self._next = at + self._every_s
        try:
            status = self._outbox.status()
        except Exception as exc:  # the reading path reports database trouble itself
            log.debug("could not look at the ack outbox: %s", exc)
            return None
        self.last = status
        age = status.oldest_pending_age_s or 0.0
        if self._pending is not None and self._oldest is not None:
            self._pending.set(status.pending)
            self._oldest.set(age)
        stuck = age > self._stale_after_s
        if stuck and not self.stuck:
            log.warning(
                "%d ack(s) have waited up to %.0f s in the outbox of %s: no relay publishes "
                "this receiver's store (start one: receiver.start_relay(), or condmsg relay "
                "with this store's URL); until then the evaluator does not see these acks",
                status.pending,
                age,
                self._store_name,
            )
        elif self.stuck and not stuck:
            log.info("the acks in the outbox of %s are being published again", self._store_name)
        self.stuck = stuck
        return status
