"""The kit's relay: the rows of an outbox table, claimed and settled through the real
:class:`~outbox.store.OutboxStore`, published to the in-memory broker.

It stands where :class:`~outbox.relay.Relay` stands in production and does what matters
for an outcome: every committed row is published once, a fan-out row as one message per
copy, and a message the broker returns (unroutable) parks its row as failed with the
reason. What the production relay adds (a connection, publisher confirms, batches in
flight, backoff, wake-ups) is about RabbitMQ over a network, which the kit does not have.
"""

from __future__ import annotations

from condmsg.testing.memory_broker import MemoryBroker
from outbox.store import Key, OutboxStore

#: Rows claimed at a time.
BATCH = 500


def relay_outbox(store: OutboxStore, broker: MemoryBroker) -> int:
    """Publish every pending row of ``store``; returns the messages published."""
    total = 0
    while True:
        claim = store.claim(BATCH)
        if not claim.rows:
            store.release(claim)
            return total
        published: list[Key] = []
        parked: dict[Key, str] = {}
        for row in claim.rows:
            for copy, message in row.expand():
                key: Key = row.id if copy is None else (row.id, copy)
                refused = broker.publish(message)
                if refused is None:
                    published.append(key)
                else:
                    parked[key] = refused
        store.settle(claim, published=published, parked=parked)
        total += len(published)
        if len(claim.rows) < BATCH:
            return total
