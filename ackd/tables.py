"""The receiver store: the receiver log (RLOG, the paper's DS.RLOG.Q), the inbox of
delivered notices, poison tracking and Message Sequence parts. Portable between SQLite and
PostgreSQL; timestamps UTC."""

from __future__ import annotations

from enum import StrEnum

import sqlalchemy as sa

metadata = sa.MetaData()

_TS = sa.DateTime(timezone=True)


class RlogState(StrEnum):
    CONSUMED = "consumed"  # the app got the original
    CANCELLED = "cancelled"  # a compensation came first: the original will be dropped


rlog = sa.Table(
    "condmsg_rlog",
    metadata,
    # One row per (CM, destination), whoever reads it: the primary key is what makes every
    # interleaving of an original and its compensation end in exactly one outcome.
    sa.Column("cm_id", sa.String(36), primary_key=True),
    sa.Column("destination", sa.String(255), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("message_id", sa.String(64)),
    sa.Column("recipient", sa.String(255)),
    sa.Column("receiver", sa.String(255), nullable=False),
    sa.Column("sender", sa.String(255)),
    sa.Column("read_at", _TS),
    # A transactional read's row commits with the app's transaction (its being there is
    # the commit); the commit's instant travels in the COMMIT ack (``committed_at``).
    sa.Column("transactional", sa.Boolean()),
    sa.Column("compensated_at", _TS),
    sa.Column("success_at", _TS),
    sa.Column("discarded_at", _TS),
    sa.Column("updated_at", _TS, nullable=False),
)

rx_inbox = sa.Table(
    "condmsg_rx_inbox",
    metadata,
    # Control messages delivered to the app, one row per (CM, destination, kind), written
    # in the transaction that delivers them: a redelivery after a crash between the app's
    # commit and the broker ack finds it and is dropped. Originals and compensations are
    # recorded by their RLOG row; a success notice may have none (its original was never
    # consumed here), and it must not write one, or the original could no longer be read.
    sa.Column("cm_id", sa.String(36), primary_key=True),
    sa.Column("destination", sa.String(255), primary_key=True),
    sa.Column("kind", sa.String(16), primary_key=True),
    sa.Column("delivered_at", _TS, nullable=False),
)

#: The redelivery counts' key column (``ackd.attempts.poison_key`` digests longer ids).
POISON_ID_LENGTH = 128

poison = sa.Table(
    "condmsg_poison",
    metadata,
    # Failed processing attempts per AMQP message id; classic queues do not count
    # redeliveries, so the receiver does, outside the rolled-back transaction.
    sa.Column("message_id", sa.String(POISON_ID_LENGTH), primary_key=True),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("last_error", sa.Text()),
    sa.Column("updated_at", _TS, nullable=False),
)

sequence_parts = sa.Table(
    "condmsg_sequence_part",
    metadata,
    sa.Column("seq_id", sa.String(64), primary_key=True),
    sa.Column("position", sa.Integer(), primary_key=True),
    sa.Column("size", sa.Integer(), nullable=False),
    sa.Column("queue", sa.String(255), nullable=False),
    sa.Column("headers_json", sa.Text(), nullable=False),
    sa.Column("properties_json", sa.Text(), nullable=False),
    sa.Column("body", sa.LargeBinary(), nullable=False),
    sa.Column("received_at", _TS, nullable=False),
)
sa.Index("ix_condmsg_sequence_part_received", sequence_parts.c.received_at)
