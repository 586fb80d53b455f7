"""The receiver store as condmsg first versioned it: the RLOG of originals read, the
inbox of control messages delivered, the parts of sequences being reassembled and the
counts of failed attempts.

Revision ID: receiver_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "receiver_0001"
down_revision = None
branch_labels = ("receiver",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "condmsg_poison",
        sa.Column("message_id", sa.String(length=128), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
    )
    op.create_table(
        "condmsg_rlog",
        sa.Column("cm_id", sa.String(length=36), nullable=False),
        sa.Column("destination", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message_id", sa.String(length=64), nullable=True),
        sa.Column("recipient", sa.String(length=255), nullable=True),
        sa.Column("receiver", sa.String(length=255), nullable=False),
        sa.Column("sender", sa.String(length=255), nullable=True),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("transactional", sa.Boolean(), nullable=True),
        sa.Column("compensated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("discarded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cm_id", "destination"),
    )
    op.create_table(
        "condmsg_rx_inbox",
        sa.Column("cm_id", sa.String(length=36), nullable=False),
        sa.Column("destination", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cm_id", "destination", "kind"),
    )
    op.create_table(
        "condmsg_sequence_part",
        sa.Column("seq_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("headers_json", sa.Text(), nullable=False),
        sa.Column("properties_json", sa.Text(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("seq_id", "position"),
    )
    op.create_index(
        "ix_condmsg_sequence_part_received", "condmsg_sequence_part", ["received_at"], unique=False
    )


def downgrade() -> None:
    op.drop_table("condmsg_sequence_part")
    op.drop_table("condmsg_rx_inbox")
    op.drop_table("condmsg_rlog")
    op.drop_table("condmsg_poison")
