"""The sender store (the paper's DS.SLOG.Q, DS.COMP.Q and the evaluator's ack log): its
tables, how they are created and the secret the store keeps.

SQLAlchemy Core tables, portable between SQLite and PostgreSQL. The ``Sender`` writes CMs,
copies and compensations; the evaluator writes acks, anomalies and the decision columns of
the CM row; the Spark audit reads them all (``condmsg export`` or JDBC). Timestamps are
timezone-aware UTC; ``sent_at`` is the sender's clock, ack timestamps the receiver's.
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from sqlalchemy.engine import Engine

# The values of the status columns, re-exported beside the tables that hold them.
from condmsg.core.store_values import AckStatus as AckStatus
from condmsg.core.store_values import AnomalyKind as AnomalyKind
from condmsg.core.store_values import CmState as CmState
from condmsg.core.store_values import ParticipantState as ParticipantState
from condmsg.core.store_values import SphereState as SphereState
from outbox.table import create_tables as create_outbox_tables

metadata = sa.MetaData()

_TS = sa.DateTime(timezone=True)
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


# Small key/value facts of the store. ``hmac_secret`` keys the copies' tokens when no
# CONDMSG_SECRET is configured: generated once, shared by every sender and evaluator
# process of this store, and never leaving it.
meta = sa.Table(
    "condmsg_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text(), nullable=False),
)

cms = sa.Table(
    "condmsg_cm",
    metadata,
    sa.Column("cm_id", sa.String(36), primary_key=True),
    sa.Column("sender", sa.String(255), nullable=False),
    sa.Column("sent_at", _TS, nullable=False),
    sa.Column("condition_json", sa.Text(), nullable=False),
    sa.Column("evaluation_deadline", _TS, nullable=False),
    sa.Column("content_type", sa.String(255)),
    sa.Column("payload_size", sa.BigInteger(), nullable=False, default=0),
    sa.Column("notify_success", sa.Boolean(), nullable=False, default=False),
    sa.Column("sphere_id", sa.String(36)),
    # Decision columns: written once by the evaluator with a conditional UPDATE
    # (``WHERE state = 'pending'``), so of two racing instances exactly one wins.
    sa.Column("state", sa.String(16), nullable=False, default=CmState.PENDING.value),
    sa.Column("next_check_at", _TS),
    sa.Column("decided_at", _TS),
    sa.Column("effective_at", _TS),
    sa.Column("reasons_json", sa.Text()),
    sa.Column("facts_json", sa.Text()),
    sa.Column("decided_by", sa.String(255)),
    # The W3C traceparent of the send's span (NULL without tracing): the evaluator's
    # decision span, maybe much later and in another process, is its child.
    sa.Column("traceparent", sa.String(55)),
)
# Deadline sweeps read ``state = 'pending' AND next_check_at <= now`` through this partial
# index: the cost of a sweep follows the CMs due, not the CMs pending.
sa.Index(
    "ix_condmsg_cm_due",
    cms.c.next_check_at,
    postgresql_where=cms.c.state == CmState.PENDING.value,
    sqlite_where=cms.c.state == CmState.PENDING.value,
)
sa.Index("ix_condmsg_cm_sent_at", cms.c.sent_at)
# A sphere's members are found through this index (most CMs belong to no sphere).
sa.Index("ix_condmsg_cm_sphere_id", cms.c.sphere_id)

copies = sa.Table(
    "condmsg_copy",
    metadata,
    sa.Column("cm_id", sa.String(36), sa.ForeignKey("condmsg_cm.cm_id"), primary_key=True),
    sa.Column("destination", sa.String(255), primary_key=True),
    sa.Column("recipient", sa.String(255)),
    sa.Column("message_id", sa.String(64), nullable=False, unique=True),
    sa.Column("exchange", sa.String(255), nullable=False),
    sa.Column("routing_key", sa.String(255), nullable=False),
    sa.Column("requires", sa.String(16), nullable=False),
    sa.Column("parts", sa.Integer(), nullable=False, default=1),
)

compensations = sa.Table(
    "condmsg_compensation",
    metadata,
    sa.Column("cm_id", sa.String(36), sa.ForeignKey("condmsg_cm.cm_id"), primary_key=True),
    sa.Column("destination", sa.String(255), primary_key=True),
    sa.Column("body", sa.LargeBinary(), nullable=False),
    sa.Column("content_type", sa.String(255)),
    sa.Column("system_generated", sa.Boolean(), nullable=False),
    sa.Column("released_at", _TS),
)

acks = sa.Table(
    "condmsg_ack",
    metadata,
    # The receiver's ack id: storing acks is idempotent on it (a redelivered ack is a
    # duplicate, recorded as an anomaly, never counted twice).
    sa.Column("ack_id", sa.String(64), primary_key=True),
    sa.Column("cm_id", sa.String(36), nullable=False, index=True),
    sa.Column("destination", sa.String(255), nullable=False),
    sa.Column("recipient", sa.String(255)),
    sa.Column("receiver", sa.String(255), nullable=False),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("read_at", _TS, nullable=False),
    sa.Column("committed_at", _TS),
    sa.Column("received_at", _TS, nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    # The W3C traceparent the ack carried (NULL without one): the decision links to it.
    sa.Column("traceparent", sa.String(55)),
)

anomalies = sa.Table(
    "condmsg_anomaly",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("cm_id", sa.String(36)),
    sa.Column("ack_id", sa.String(64)),
    sa.Column("destination", sa.String(255)),
    sa.Column("recipient", sa.String(255)),
    sa.Column("detail", sa.Text(), nullable=False),
    sa.Column("recorded_at", _TS, nullable=False),
)
sa.Index("ix_condmsg_anomaly_recorded_at", anomalies.c.recorded_at)
# Retention archives a CM's anomalies with it, found through this index.
sa.Index("ix_condmsg_anomaly_cm_id", anomalies.c.cm_id)

# Dependency-Spheres (docs/spheres.md): the sphere log. The sender writes a sphere's
# beginning, members (``condmsg_cm.sphere_id``), participants and its commit or abort
# request; the evaluator decides its outcome once (a conditional UPDATE, like a CM's).
spheres = sa.Table(
    "condmsg_sphere",
    metadata,
    sa.Column("sphere_id", sa.String(36), primary_key=True),
    sa.Column("sender", sa.String(255), nullable=False),
    sa.Column("begun_at", _TS, nullable=False),
    sa.Column("deadline", _TS, nullable=False),
    # Sends add to it under the row's lock, and only while the sphere is open.
    sa.Column("members", sa.Integer(), nullable=False, default=0),
    sa.Column("state", sa.String(16), nullable=False, default=SphereState.OPEN.value),
    sa.Column("committed_at", _TS),
    sa.Column("aborted_at", _TS),
    sa.Column("abort_reason", sa.Text()),
    sa.Column("next_check_at", _TS),
    sa.Column("decided_at", _TS),
    sa.Column("effective_at", _TS),
    sa.Column("reasons_json", sa.Text()),
    sa.Column("decided_by", sa.String(255)),
    # Each member's own verdict when the sphere was decided (``pending`` for one undecided
    # then), as the outcome notification carried it: members decided later do not change
    # what the decision was.
    sa.Column("member_verdicts_json", sa.Text()),
)
_UNDECIDED_SPHERE = spheres.c.state.in_(
    [SphereState.OPEN.value, SphereState.COMMITTED.value, SphereState.ABORTED.value]
)
# The evaluator's sphere sweep (timeouts, commits and aborts to act on), like the CMs'.
sa.Index(
    "ix_condmsg_sphere_due",
    spheres.c.next_check_at,
    postgresql_where=_UNDECIDED_SPHERE,
    sqlite_where=_UNDECIDED_SPHERE,
)

sphere_participants = sa.Table(
    "condmsg_sphere_participant",
    metadata,
    sa.Column(
        "sphere_id", sa.String(36), sa.ForeignKey("condmsg_sphere.sphere_id"), primary_key=True
    ),
    # Stable across processes: a prepared transaction's global id, a handler's position.
    sa.Column("participant_id", sa.String(200), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),  # postgresql, handler or custom
    # Where its work lives: a database URL without its password, a handler's name.
    sa.Column("resource", sa.Text(), nullable=False),
    sa.Column("args_json", sa.Text()),
    sa.Column("run_on", sa.String(16)),  # a handler's outcome: satisfied or violated
    sa.Column("state", sa.String(16), nullable=False, default=ParticipantState.ENLISTED.value),
    sa.Column("enlisted_at", _TS, nullable=False),
    sa.Column("resolved_at", _TS),
    sa.Column("detail", sa.Text()),
)


def create_tables(engine: Engine) -> None:
    """Create the sender store's tables and its outbox if missing."""
    metadata.create_all(engine)
    create_outbox_tables(engine)


def store_secret(engine: Engine) -> bytes:
    """The store's HMAC secret, generated once (first writer wins) and shared after."""
    with engine.begin() as conn:
        found = conn.execute(sa.select(meta.c.value).where(meta.c.key == "hmac_secret"))
        value = found.scalar_one_or_none()
        if value is None:
            candidate = secrets.token_hex(32)
            try:
                with conn.begin_nested():
                    conn.execute(sa.insert(meta), [{"key": "hmac_secret", "value": candidate}])
                value = candidate
            except sa.exc.IntegrityError:
                # Another process stored one first: use theirs.
                value = conn.execute(
                    sa.select(meta.c.value).where(meta.c.key == "hmac_secret")
                ).scalar_one()
    return bytes.fromhex(value)
