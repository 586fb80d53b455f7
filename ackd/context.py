"""What the parts of one ``Receiver`` share: its store, broker and settings, its counters,
and what it knows of the sequences waiting in its store."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import Engine

from ackd.attempts import AttemptCounts
from ackd.broker import Broker
from ackd.receiver_config import ReceiverConfig
from ackd.receiver_store import ReceiverStore


@dataclass(slots=True)
class ReceiverStats:
    delivered: int = 0
    duplicates: int = 0
    discards: int = 0
    cancelled: int = 0
    invalid: int = 0
    rolled_back: int = 0
    parts: int = 0


@dataclass(slots=True)
class PendingSequences:
    """Whether the store may hold a complete sequence for this receiver, and the
    reassembled sequences held back for their backoff after a failed attempt.

    Looking in the store costs a query, so a reader looks only when something may have
    completed a sequence (a part stored, a transaction committed or rolled back, a
    sequence put back) and, as a safety net, every few seconds: other consumers' commits
    complete sequences too.
    """

    maybe_complete: bool = True
    #: ``time.monotonic()`` after which a reader looks regardless.
    next_recheck: float = 0.0
    #: Seq id -> the receiver's monotonic instant before which it is not taken again.
    retry_due: dict[str, float] = field(default_factory=dict)

    def is_held_back(self, seq_id: str, now: float) -> bool:
        """Whether ``seq_id`` waits for its retry at ``now`` (the receiver's monotonic
        clock)."""
        due = self.retry_due.get(seq_id)
        if due is None:
            return False
        if now < due:
            return True
        del self.retry_due[seq_id]
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveContext:
    """The parts of one receiver that every part doing its work shares.

    ``stats`` and ``pending`` change as the receiver works; the rest is fixed when it is
    built. ``monotonic`` (seconds) times the receiver's pauses: a sequence's retry,
    the checks for incomplete sequences. ``row_locks`` is the store's
    :class:`~ackd.receiver_store.StoreTraits` trait for ``engine``; ``store_lost`` tells
    an outage of the store from a message's own failure (the
    :class:`~ackd.receiver.Receiver` owns the connection it looks at).
    """

    engine: Engine
    store: ReceiverStore
    row_locks: bool
    broker: Broker
    attempts: AttemptCounts
    config: ReceiverConfig
    recipient: str
    receiver_id: str
    clock: Callable[[], datetime]
    store_lost: Callable[[BaseException], bool]
    stats: ReceiverStats = field(default_factory=ReceiverStats)
    pending: PendingSequences = field(default_factory=PendingSequences)
    monotonic: Callable[[], float] = time.monotonic
