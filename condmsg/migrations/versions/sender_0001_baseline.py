"""The sender store as condmsg first versioned it: conditional messages, their copies,
acks, compensations, anomalies and the store's key/value facts.

Revision ID: sender_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "sender_0001"
down_revision = None
branch_labels = ("sender",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "condmsg_ack",
        sa.Column("ack_id", sa.String(length=64), nullable=False),
        sa.Column("cm_id", sa.String(length=36), nullable=False),
        sa.Column("destination", sa.String(length=255), nullable=False),
        sa.Column("recipient", sa.String(length=255), nullable=True),
        sa.Column("receiver", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.PrimaryKeyConstraint("ack_id"),
    )
    op.create_index(op.f("ix_condmsg_ack_cm_id"), "condmsg_ack", ["cm_id"], unique=False)
    op.create_table(
        "condmsg_anomaly",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("cm_id", sa.String(length=36), nullable=True),
        sa.Column("ack_id", sa.String(length=64), nullable=True),
        sa.Column("destination", sa.String(length=255), nullable=True),
        sa.Column("recipient", sa.String(length=255), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_condmsg_anomaly_cm_id", "condmsg_anomaly", ["cm_id"], unique=False)
    op.create_index(
        "ix_condmsg_anomaly_recorded_at", "condmsg_anomaly", ["recorded_at"], unique=False
    )
    op.create_table(
        "condmsg_cm",
        sa.Column("cm_id", sa.String(length=36), nullable=False),
        sa.Column("sender", sa.String(length=255), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("condition_json", sa.Text(), nullable=False),
        sa.Column("evaluation_deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("content_type", sa.String(length=255), nullable=True),
        sa.Column("payload_size", sa.BigInteger(), nullable=False),
        sa.Column("notify_success", sa.Boolean(), nullable=False),
        sa.Column("sphere_id", sa.String(length=36), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("next_check_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("effective_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reasons_json", sa.Text(), nullable=True),
        sa.Column("facts_json", sa.Text(), nullable=True),
        sa.Column("decided_by", sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint("cm_id"),
    )
    op.create_index(
        "ix_condmsg_cm_due",
        "condmsg_cm",
        ["next_check_at"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    op.create_index("ix_condmsg_cm_sent_at", "condmsg_cm", ["sent_at"], unique=False)
    op.create_table(
        "condmsg_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "condmsg_compensation",
        sa.Column("cm_id", sa.String(length=36), nullable=False),
        sa.Column("destination", sa.String(length=255), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("content_type", sa.String(length=255), nullable=True),
        sa.Column("system_generated", sa.Boolean(), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cm_id"],
            ["condmsg_cm.cm_id"],
        ),
        sa.PrimaryKeyConstraint("cm_id", "destination"),
    )
    op.create_table(
        "condmsg_copy",
        sa.Column("cm_id", sa.String(length=36), nullable=False),
        sa.Column("destination", sa.String(length=255), nullable=False),
        sa.Column("recipient", sa.String(length=255), nullable=True),
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("exchange", sa.String(length=255), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=False),
        sa.Column("requires", sa.String(length=16), nullable=False),
        sa.Column("parts", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cm_id"],
            ["condmsg_cm.cm_id"],
        ),
        sa.PrimaryKeyConstraint("cm_id", "destination"),
        sa.UniqueConstraint("message_id"),
    )


def downgrade() -> None:
    op.drop_table("condmsg_copy")
    op.drop_table("condmsg_compensation")
    op.drop_table("condmsg_meta")
    op.drop_table("condmsg_cm")
    op.drop_table("condmsg_anomaly")
    op.drop_table("condmsg_ack")
