"""The end of an app's transaction: commit with the acks it owes, then ack the AMQP
messages; or roll back, count a failed attempt of each message the app had and give
them back after their backoff."""

from __future__ import annotations

import logging

from ackd.attempts import poison_key
from ackd.context import ReceiveContext
from ackd.emit import commit_with_acks
from ackd.transaction import ReceiverTransaction, Taken
from condmsg.core.protocol import MessageKind

log = logging.getLogger(__name__)


class Settlement:
    """Commits and rolls back the transactions of one receiver."""

    def __init__(self, context: ReceiveContext) -> None:
        self._ctx = context

    def commit(self, tx: ReceiverTransaction) -> None:
        try:
            commit_with_acks(
                self._ctx.store,
                tx.session,
                [
                    (taken.inbound, taken.read_at)
                    for taken in tx.taken_messages
                    if taken.delivered and taken.inbound.kind is MessageKind.ORIGINAL
                ],
                committed_at=self._ctx.clock(),
                recipient=self._ctx.recipient,
                receiver=self._ctx.receiver_id,
            )
            if any(t.inbound.seq_id is not None for t in tx.taken_messages):
                # Parts stored by this transaction are visible now: the sequence may be
                # complete (another consumer's check may have run before this commit).
                self._ctx.pending.maybe_complete = True
        except BaseException as exc:
            self.rollback(tx, exc)
            raise
        # Only now: a crash before these acks makes RabbitMQ redeliver, and the RLOG row (a
        # success notice's inbox row) committed above drops the redelivery (the app never
        # sees a copy, compensation or notice twice). That is also why the acks of
        # conditional messages may be deferred and batched; plain messages and sequence
        # parts have no such row and are acked at once.
        for taken in tx.taken_messages:
            if taken.delivery is not None:
                rlog_backed = taken.inbound.kind is not None and taken.inbound.seq_id is None
                self._ctx.broker.ack(taken.delivery, deferred=rlog_backed)

    def rollback(self, tx: ReceiverTransaction, exc: BaseException) -> None:
        """Roll back, and give every message taken back to its queue: after its backoff
        if the app had it and failed, at once and uncounted if the store was lost (not
        the message's fault: another consumer, or this one once the store answers, takes
        it again)."""
        try:
            tx.session.rollback()
        except Exception:  # a lost connection: the server has rolled back on its own
            log.debug("rollback on a lost connection", exc_info=True)
        self._ctx.stats.rolled_back += 1
        if self._ctx.store_lost(exc):
            for taken in tx.taken_messages:
                self._give_back(taken, 0.0)
            return
        # The messages the app had: delivered originals and plain messages (a plain one is
        # taken with ``delivered`` False, as it holds no RLOG row, but the app had it too).
        # Each failure counts as one attempt of each, and holds it back for its backoff.
        failed = [t for t in tx.taken_messages if t.delivered or t.inbound.kind is None]
        keys = [poison_key(t.message_id) for t in failed if t.message_id]
        totals = self._ctx.attempts.record(keys, repr(exc)[:500], self._ctx.clock()) if keys else {}
        for taken in tx.taken_messages:
            delay = 0.0
            if any(taken is t for t in failed):
                message_id = taken.message_id
                # An id-less message cannot be counted; it still waits the first pause.
                attempts = totals[poison_key(message_id)] if message_id else 1
                delay = self._ctx.config.retry.delay_s(attempts)
            self._give_back(taken, delay)

    def _give_back(self, taken: Taken, delay: float) -> None:
        if taken.delivery is not None:
            self._ctx.broker.requeue(taken.delivery, after_s=delay)
            return
        self._ctx.pending.maybe_complete = True  # a reassembled sequence is back in the store
        if delay > 0 and taken.message_id:
            due = self._ctx.monotonic() + delay
            self._ctx.pending.retry_due[str(taken.message_id)] = due
