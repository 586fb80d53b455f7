"""A receiver's side of Message Sequences: keeping parts in the store, delivering complete
sequences from it (judged like a whole message) and moving expired ones to the invalid
queue. The parts' rows and queries are in :mod:`ackd.sequence`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ackd import sequence
from ackd.attempts import AttemptCounts
from ackd.broker import Broker, Delivery
from ackd.decisions import RlogDecisions
from ackd.inbound import Inbound, InvalidMessage, check_payload, check_token, parse
from ackd.incoming import (
    Incoming,
    PendingSequences,
    ReceiverStats,
    ReceiverTransaction,
    TakenMessage,
    undecodable,
)
from ackd.message import Message
from ackd.receiver_store import ReceiverStore

log = logging.getLogger(__name__)


class SequenceReassembly:
    """Stores the parts one receiver reads and delivers the sequences they complete."""

    def __init__(
        self,
        *,
        engine: Engine,
        store: ReceiverStore,
        broker: Broker,
        stats: ReceiverStats,
        pending: PendingSequences,
        decisions: RlogDecisions,
        attempts: AttemptCounts,
        max_attempts: int,
        clock: Callable[[], datetime],
        secret: bytes | None,
        sequence_timeout: timedelta,
        invalid_queue: str,
    ) -> None:
        self._engine = engine
        self._store = store
        self._broker = broker
        self._stats = stats
        self._pending = pending
        self._decisions = decisions
        self._attempts = attempts
        self._max_attempts = max_attempts
        self._clock = clock
        self._secret = secret
        self._sequence_timeout = sequence_timeout
        self._invalid_queue = invalid_queue
        self._next_expiry_check = 0.0

    def store_part(
        self,
        delivery: Delivery,
        inbound: Inbound,
        part: dict[str, Any],
        tx: ReceiverTransaction | None,
    ) -> None:
        """Keep a part in the store. Inside a transaction it is stored (and acked) with the
        transaction, so a rollback requeues it; otherwise at once."""
        if tx is not None:
            self._store.store_part(tx.session, part)
            incoming = Incoming(
                delivery.queue, b"", None, None, delivery.headers, delivery.redelivered, delivery
            )
            tx.taken_messages.append(
                TakenMessage(incoming, inbound, part["received_at"], delivered=False)
            )
        else:
            with Session(self._engine) as session, session.begin():
                self._store.store_part(session, part)
            self._broker.ack(delivery)
        self._stats.parts += 1
        self._pending.maybe_complete = True

    def deliver_complete(self, queue: str, tx: ReceiverTransaction | None) -> Message | None:
        """Deliver a complete sequence of ``queue`` from the store, if there is one."""
        if tx is not None:
            return self._deliver_first_complete(tx.session, queue, tx)
        with Session(self._engine) as session, session.begin():
            return self._deliver_first_complete(session, queue, None)

    def _deliver_first_complete(
        self, session: Session, queue: str, tx: ReceiverTransaction | None
    ) -> Message | None:
        ids = sequence.complete_ids(session, queue)
        if not ids:
            self._pending.maybe_complete = False
            return None
        for seq_id in ids:
            if self._pending.is_held_back(seq_id):
                continue
            assembled = sequence.take(session, seq_id)
            if assembled is None:
                continue
            read_at = self._clock()
            judged = self._judge_sequence(assembled)
            if judged is None:
                continue
            inbound, headers, properties = judged
            if tx is not None:
                reason = self._attempts.dead_letter_reason(session, seq_id, self._max_attempts)
                if reason is not None:
                    self._broker.publish_invalid(assembled.body, headers, reason)
                    self._stats.invalid += 1
                    continue
            incoming = Incoming(
                queue=queue,
                body=assembled.body,
                content_type=properties.get("content_type"),
                message_id=seq_id,
                headers=headers,
                redelivered=False,
                delivery=None,
            )
            message = self._decisions.decide(session, incoming, inbound, read_at, tx)
            if message is not None:
                return message
        return None

    def _judge_sequence(
        self, assembled: sequence.Assembled
    ) -> tuple[Inbound, dict[str, Any], dict[str, Any]] | None:
        """The condmsg facts of a taken sequence, or None after moving it to the invalid
        queue (its parts' deletion commits with the caller's transaction)."""
        headers: dict[str, Any] = {}
        try:
            headers, properties = sequence.metadata_of(assembled)
            inbound = parse(headers, properties.get("reply_to"))
            # Parts carry their copy's token: the whole is judged as the original it is.
            check_token(inbound, self._secret, assembled.body)
            check_payload(assembled.body, properties.get("content_type"))
        except Exception as exc:  # a codec's bug costs this sequence, never the reader
            reason = str(exc) if isinstance(exc, InvalidMessage) else undecodable(exc)
            log.warning(
                "moving sequence %s to %s: %s", assembled.seq_id, self._invalid_queue, reason
            )
            self._broker.publish_invalid(assembled.body, headers, reason)
            self._stats.invalid += 1
            return None
        return inbound, headers, properties

    def expire_incomplete(self) -> None:
        """Move the parts of sequences incomplete after ``sequence_timeout`` to the invalid
        queue; looks at most every quarter of the timeout (and at most once a second)."""
        now_mono = time.monotonic()
        if now_mono < self._next_expiry_check:
            return
        timeout = self._sequence_timeout
        self._next_expiry_check = now_mono + max(1.0, timeout.total_seconds() / 4)
        cutoff = self._clock() - timeout
        with Session(self._engine) as session, session.begin():
            expired = sequence.take_expired(session, cutoff)
            by_seq: dict[str, list[tuple[int, int]]] = {}
            for seq_id, position, size, body, headers in expired:
                by_seq.setdefault(seq_id, []).append((position, size))
                reason = (
                    f"incomplete sequence {seq_id}: part {position + 1} of {size}, "
                    f"others missing after {timeout}"
                )
                # Published before the deleting transaction commits: a crash in between
                # duplicates parts on the invalid queue, it never loses them.
                self._broker.publish_invalid(body, headers, reason)
            for seq_id, seen in by_seq.items():
                log.warning(
                    "sequence %s incomplete (%d of %d parts); moved to %s",
                    seq_id,
                    len(seen),
                    seen[0][1],
                    self._invalid_queue,
                )
                self._stats.invalid += 1
