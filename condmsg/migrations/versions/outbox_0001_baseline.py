"""The outbox table as condmsg first versioned it: messages waiting for the relay,
its partial indexes of pending and parked rows, and (PostgreSQL) the NOTIFY trigger that
wakes a relay when a transaction that added rows commits.

Revision ID: outbox_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "outbox_0001"
down_revision = None
branch_labels = ("outbox",)
depends_on = None

#: The same function and trigger as ``outbox.table`` attaches to tables it creates.
NOTIFY_FUNCTION = (
    "CREATE OR REPLACE FUNCTION condmsg_outbox_notify() RETURNS trigger "
    "LANGUAGE plpgsql AS $$ BEGIN "
    "PERFORM pg_notify('outbox_' || md5(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME), ''); "
    "RETURN NULL; END $$"
)
NOTIFY_TRIGGER = (
    "CREATE TRIGGER condmsg_outbox_notify AFTER INSERT ON condmsg_outbox "
    "FOR EACH STATEMENT EXECUTE FUNCTION condmsg_outbox_notify()"
)


def upgrade() -> None:
    op.create_table(
        "condmsg_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("exchange", sa.String(length=255), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=True),
        sa.Column("correlation_id", sa.String(length=255), nullable=True),
        sa.Column("reply_to", sa.String(length=255), nullable=True),
        sa.Column("content_type", sa.String(length=255), nullable=True),
        sa.Column("content_encoding", sa.String(length=255), nullable=True),
        sa.Column("message_type", sa.String(length=255), nullable=True),
        sa.Column("headers", sa.JSON(), nullable=True),
        sa.Column("priority", sa.SmallInteger(), nullable=True),
        sa.Column("expiration_ms", sa.BigInteger(), nullable=True),
        sa.Column("persistent", sa.Boolean(), nullable=False),
        sa.Column("mandatory", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("available_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("copies", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_condmsg_outbox_failed",
        "condmsg_outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("state = 'failed'"),
        sqlite_where=sa.text("state = 'failed'"),
    )
    op.create_index(
        "ix_condmsg_outbox_pending",
        "condmsg_outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(NOTIFY_FUNCTION)
        op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS condmsg_outbox_notify ON condmsg_outbox")
    op.drop_table("condmsg_outbox")
