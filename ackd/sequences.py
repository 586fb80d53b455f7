"""Message Sequences on the receiver's side: their parts kept in the receiver store,
complete sequences delivered from it (judged like a whole message), incomplete ones moved
to the invalid-message queue after the timeout.

Each part of a large copy is stored (and its AMQP message acked) as it arrives, so
competing consumers can share the parts (the store's ``store_part``,
:mod:`ackd.receiver_store`). A sequence whose parts are all stored is *complete*;
whichever consumer takes it first deletes the parts in the transaction that delivers the
whole message, so a rolled-back delivery leaves them for a later read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd import stored_headers
from ackd.broker import Delivery
from ackd.context import ReceiveContext
from ackd.message import Message
from ackd.rlog import RlogDecisions
from ackd.tables import rlog
from ackd.tables import sequence_parts as parts
from ackd.transaction import ReceiverTransaction, Taken
from ackd.validation import (
    Inbound,
    InvalidMessage,
    check_payload,
    check_token,
    invalid_reason,
    parse,
)
from condmsg.core import protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Assembled:
    """A complete sequence taken from the store: the whole body, and the first part's
    headers and properties as stored (JSON; :func:`metadata_of` decodes them)."""

    seq_id: str
    body: bytes
    headers_json: str
    properties_json: str
    #: The queue its first part was read from.
    queue: str = ""


def part_row(
    delivery: Delivery, *, seq_id: str, position: int, size: int, now: datetime
) -> dict[str, Any]:
    """The store row of one part. Encoding its headers can fail on what a sender put in
    them (a table nested too deep for JSON): :meth:`SequenceReassembly.store_part` makes
    that part invalid before storing anything."""
    props = delivery.properties
    return {
        "seq_id": seq_id,
        "position": position,
        "size": size,
        "queue": delivery.queue,
        "headers_json": stored_headers.to_json(delivery.headers),
        "properties_json": json.dumps(
            {
                "content_type": props.content_type,
                "message_id": props.message_id,
                "correlation_id": props.correlation_id,
                "reply_to": props.reply_to,
            },
            default=str,
        ),
        "body": delivery.body,
        "received_at": now,
    }


def complete_ids(session: Session, queue: str, limit: int = 10) -> list[str]:
    """Sequences of ``queue`` whose parts are all stored."""
    query = (
        sa.select(parts.c.seq_id)
        .where(parts.c.queue == queue)
        .group_by(parts.c.seq_id, parts.c.size)
        .having(sa.func.count() == parts.c.size)
        .limit(limit)
    )
    return [row.seq_id for row in session.execute(query)]


@dataclass(frozen=True, slots=True)
class Discordant:
    """A sequence taken from the store whose parts do not make one whole (they disagree on
    its size, or some were gone): each part goes to the invalid-message queue with
    ``reason`` and its position, never dropped. ``parts``: ``(position, size, body,
    headers)``."""

    seq_id: str
    reason: str
    parts: list[tuple[int, int, bytes, dict[str, Any]]]


def take(session: Session, seq_id: str) -> Assembled | Discordant | None:
    """Assemble and delete a complete sequence; None if another consumer took it first.

    The DELETE ... RETURNING is the claim: on PostgreSQL a concurrent taker blocks on the
    rows and, once the first commits, deletes nothing. Parts that turn out not to make one
    whole come back as :class:`Discordant`, for the invalid-message queue: deleted with
    nothing to show for them, they would be lost.
    """
    stmt = (
        sa.delete(parts)
        .where(parts.c.seq_id == seq_id)
        .returning(
            parts.c.position,
            parts.c.size,
            parts.c.body,
            parts.c.headers_json,
            parts.c.properties_json,
            parts.c.queue,
        )
    )
    rows = sorted(session.execute(stmt).all(), key=lambda r: r.position)
    if not rows:
        return None
    first = rows[0]
    if len(rows) != first.size or any(r.size != first.size for r in rows):
        return Discordant(
            seq_id,
            _discord(seq_id, [(r.position, r.size) for r in rows]),
            [(r.position, r.size, r.body, _invalid_headers(r.headers_json, r.queue)) for r in rows],
        )
    return Assembled(
        seq_id=seq_id,
        body=b"".join(r.body for r in rows),
        headers_json=first.headers_json,
        properties_json=first.properties_json,
        queue=first.queue,
    )


def _discord(seq_id: str, positions: list[tuple[int, int]]) -> str:
    """Why taken parts ``(position, size)`` do not make one whole (positions from 1)."""
    sizes = sorted({size for _, size in positions})
    if len(sizes) == 1:
        return f"incomplete sequence {seq_id}: {len(positions)} of {sizes[0]} parts when taken"
    claims = []
    for size in sizes:
        at = [str(p + 1) for p, s in positions if s == size]
        claims.append(f"{'parts' if len(at) > 1 else 'part'} {', '.join(at)}: {size}")
    return f"inconsistent sequence {seq_id}: its parts disagree on its size ({'; '.join(claims)})"


def metadata_of(assembled: Assembled) -> tuple[dict[str, Any], dict[str, Any]]:
    """The headers and properties of an assembled sequence; raises :class:`InvalidMessage`
    if the stored JSON is not an object."""
    headers, properties = json.loads(assembled.headers_json), json.loads(assembled.properties_json)
    if not isinstance(headers, dict) or not isinstance(properties, dict):
        raise InvalidMessage(f"sequence {assembled.seq_id}: stored headers are not an object")
    return headers, properties


def take_expired(
    session: Session, older_than: datetime
) -> list[tuple[str, int, int, bytes, dict[str, Any]]]:
    """Delete and return the parts of sequences with a part older than ``older_than`` that
    are still incomplete: ``(seq_id, position, size, body, headers)``, the headers those
    of the part for the invalid-message queue."""
    stale = (
        sa.select(parts.c.seq_id)
        .group_by(parts.c.seq_id, parts.c.size)
        .having(sa.func.min(parts.c.received_at) < older_than)
        .having(sa.func.count() < parts.c.size)
    )
    ids = [row.seq_id for row in session.execute(stale)]
    if not ids:
        return []
    stmt = (
        sa.delete(parts)
        .where(parts.c.seq_id.in_(ids))
        .returning(
            parts.c.seq_id,
            parts.c.position,
            parts.c.size,
            parts.c.body,
            parts.c.headers_json,
            parts.c.queue,
        )
    )
    return [
        (r.seq_id, r.position, r.size, r.body, _invalid_headers(r.headers_json, r.queue))
        for r in session.execute(stmt)
    ]


def _invalid_headers(headers_json: str, queue: str) -> dict[str, Any]:
    """A stored part's headers for the invalid queue: those stored (none if they cannot be
    read back: the part still goes, rather than stopping the expiry of the others) and
    the queue it was read from, as a message moved straight from a delivery has."""
    return {**stored_headers.from_json(headers_json), protocol.H_ORIGINAL_QUEUE: queue}


def _with_queue(headers: dict[str, Any], assembled: Assembled) -> dict[str, Any]:
    """A whole's headers for the invalid queue: part 0's, and the queue it was read from."""
    return {**headers, protocol.H_ORIGINAL_QUEUE: assembled.queue}


class SequenceReassembly:
    """Stores the parts one receiver reads and delivers the sequences they complete."""

    def __init__(self, context: ReceiveContext, decisions: RlogDecisions) -> None:
        self._ctx = context
        self._decisions = decisions
        self._next_expiry_check = 0.0

    def store_part(
        self,
        delivery: Delivery,
        inbound: Inbound,
        received_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> None:
        """Keep a judged part in the store: inside a transaction with it (the transaction
        settles its delivery, so a rollback requeues it), otherwise at once (the caller
        then acks it); a part whose sequence was taken already is dropped the same way,
        unstored. Raises :class:`InvalidMessage` before storing anything if its headers
        cannot be kept (a table nested too deep for JSON)."""
        assert inbound.seq_id is not None and inbound.seq_pos is not None and inbound.seq_size
        try:
            row = part_row(
                delivery,
                seq_id=inbound.seq_id,
                position=inbound.seq_pos,
                size=inbound.seq_size,
                now=received_at,
            )
        except Exception as exc:  # what a sender put in the headers costs this part only
            raise InvalidMessage(invalid_reason(exc)) from exc
        if tx is not None:
            stored = self._store_unless_taken(tx.session, inbound, row)
            part = Taken(
                queue=delivery.queue,
                body=b"",
                content_type=None,
                message_id=None,
                headers=delivery.headers,
                redelivered=delivery.redelivered,
                delivery=delivery,
                inbound=inbound,
                read_at=received_at,
            )
            tx.keep(part)
        else:
            with Session(self._ctx.engine) as session, session.begin():
                stored = self._store_unless_taken(session, inbound, row)
        if stored:
            self._ctx.stats.parts += 1
            self._ctx.pending.maybe_complete = True

    def _store_unless_taken(self, session: Session, inbound: Inbound, row: dict[str, Any]) -> bool:
        """Store the part, unless its whole was taken already; True if it was stored.

        A part whose sequence was taken (delivered or discarded: the receiver log row of
        its CM and destination holds the sequence id) comes again when the broker ack of
        its delivery was lost after the commit that stored it, or when it was published
        twice. It can never complete a sequence: it is a duplicate, dropped, and its
        delivery is acked like a stored part's. (A transaction taking the whole that has
        not committed yet is not seen here: such a part is stored, and expires.)
        """
        taken = sa.select(rlog.c.cm_id).where(
            rlog.c.cm_id == inbound.cm_id,
            rlog.c.destination == inbound.destination,
            rlog.c.message_id == inbound.seq_id,
        )
        if session.execute(taken).first() is not None:
            log.info(
                "dropping part %s of sequence %s from %r: its sequence was taken already",
                row["position"] + 1,
                inbound.seq_id,
                row["queue"],
            )
            self._ctx.stats.duplicates += 1
            return False
        self._ctx.store.store_part(session, row)
        return True

    def deliver_complete(self, queue: str, tx: ReceiverTransaction | None) -> Message | None:
        """Deliver a complete sequence of ``queue`` from the store, if there is one."""
        if tx is not None:
            return self._deliver_first_complete(tx.session, queue, tx)
        with Session(self._ctx.engine) as session, session.begin():
            return self._deliver_first_complete(session, queue, None)

    def _deliver_first_complete(
        self, session: Session, queue: str, tx: ReceiverTransaction | None
    ) -> Message | None:
        ids = complete_ids(session, queue)
        if not ids:
            self._ctx.pending.maybe_complete = False
            return None
        for seq_id in ids:
            if self._ctx.pending.is_held_back(seq_id, self._ctx.monotonic()):
                continue
            assembled = take(session, seq_id)
            if assembled is None:
                continue
            if isinstance(assembled, Discordant):
                self._move_discordant(assembled)
                continue
            read_at = self._ctx.clock()
            judged = self._judge_sequence(assembled)
            if judged is None:
                continue
            inbound, headers, properties = judged
            if tx is not None:
                reason = self._ctx.attempts.dead_letter_reason(
                    session, seq_id, self._ctx.config.max_attempts
                )
                if reason is not None:
                    self._ctx.broker.publish_invalid(
                        assembled.body, _with_queue(headers, assembled), reason
                    )
                    self._ctx.stats.invalid += 1
                    continue
            taken = Taken(
                queue=queue,
                body=assembled.body,
                content_type=properties.get("content_type"),
                message_id=seq_id,
                headers=headers,
                redelivered=False,
                delivery=None,
                inbound=inbound,
                read_at=read_at,
            )
            # A reassembled sequence has no delivery to settle: its parts' deletion
            # commits with the decision.
            message, _ = self._decisions.decide(session, taken, tx)
            if message is not None:
                return message
        return None

    def _move_discordant(self, discordant: Discordant) -> None:
        """Publish each part of ``discordant`` to the invalid queue; their deletion commits
        with the caller's transaction, after the publishes (a crash in between duplicates
        parts on the invalid queue, it never loses them)."""
        log.warning(
            "moving the %d parts of sequence %s to %s: %s",
            len(discordant.parts),
            discordant.seq_id,
            self._ctx.config.invalid_queue,
            discordant.reason,
        )
        for position, size, body, headers in discordant.parts:
            reason = f"{discordant.reason}; this is part {position + 1} of {size}"
            self._ctx.broker.publish_invalid(body, headers, reason)
        self._ctx.stats.invalid += 1

    def _judge_sequence(
        self, assembled: Assembled
    ) -> tuple[Inbound, dict[str, Any], dict[str, Any]] | None:
        """The condmsg facts of a taken sequence, or None after moving it to the invalid
        queue (its parts' deletion commits with the caller's transaction)."""
        headers: dict[str, Any] = {}
        try:
            headers, properties = metadata_of(assembled)
            inbound = parse(headers, properties.get("reply_to"))
            # Parts carry their copy's token: the whole is judged as the original it is.
            check_token(inbound, self._ctx.config.secret, assembled.body)
            check_payload(assembled.body, properties.get("content_type"))
        except Exception as exc:  # a codec's bug costs this sequence, never the reader
            reason = invalid_reason(exc)
            log.warning(
                "moving sequence %s to %s: %s",
                assembled.seq_id,
                self._ctx.config.invalid_queue,
                reason,
            )
            self._ctx.broker.publish_invalid(
                assembled.body, _with_queue(headers, assembled), reason
            )
            self._ctx.stats.invalid += 1
            return None
        return inbound, headers, properties

    def expiry_due(self) -> bool:
        return self._ctx.monotonic() >= self._next_expiry_check

    def expire_incomplete(self) -> None:
        """Move the parts of sequences incomplete after ``sequence_timeout`` to the invalid
        queue; looks at most every quarter of the timeout (and at most once a second)."""
        now_mono = self._ctx.monotonic()
        if now_mono < self._next_expiry_check:
            return
        timeout = self._ctx.config.sequence_timeout
        self._next_expiry_check = now_mono + max(1.0, timeout.total_seconds() / 4)
        cutoff = self._ctx.clock() - timeout
        with Session(self._ctx.engine) as session, session.begin():
            expired = take_expired(session, cutoff)
            by_seq: dict[str, list[tuple[int, int]]] = {}
            for seq_id, position, size, body, headers in expired:
                by_seq.setdefault(seq_id, []).append((position, size))
                reason = (
                    f"incomplete sequence {seq_id}: part {position + 1} of {size}, "
                    f"others missing after {timeout}"
                )
                # Published before the deleting transaction commits: a crash in between
                # duplicates parts on the invalid queue, it never loses them.
                self._ctx.broker.publish_invalid(body, headers, reason)
            for seq_id, seen in by_seq.items():
                log.warning(
                    "sequence %s incomplete (%d of %d parts); moved to %s",
                    seq_id,
                    len(seen),
                    seen[0][1],
                    self._ctx.config.invalid_queue,
                )
                self._ctx.stats.invalid += 1
