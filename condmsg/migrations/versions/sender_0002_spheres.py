"""Dependency-Spheres: the sphere log (spheres and their participants) and the index that
finds a sphere's members.

A store that ``create_all`` made before it was versioned may hold these already (the
models create them): each is created only if it is missing.

Revision ID: sender_0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "sender_0002"
down_revision = "sender_0001"
branch_labels = None
depends_on = None

_UNDECIDED = "state IN ('open', 'committed', 'aborted')"


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "ix_condmsg_cm_sphere_id" not in {i["name"] for i in inspector.get_indexes("condmsg_cm")}:
        op.create_index("ix_condmsg_cm_sphere_id", "condmsg_cm", ["sphere_id"], unique=False)
    if not inspector.has_table("condmsg_sphere"):
        op.create_table(
            "condmsg_sphere",
            sa.Column("sphere_id", sa.String(length=36), nullable=False),
            sa.Column("sender", sa.String(length=255), nullable=False),
            sa.Column("begun_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
            sa.Column("members", sa.Integer(), nullable=False),
            sa.Column("state", sa.String(length=16), nullable=False),
            sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("aborted_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("abort_reason", sa.Text(), nullable=True),
            sa.Column("next_check_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("effective_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("reasons_json", sa.Text(), nullable=True),
            sa.Column("decided_by", sa.String(length=255), nullable=True),
            sa.PrimaryKeyConstraint("sphere_id"),
        )
        op.create_index(
            "ix_condmsg_sphere_due",
            "condmsg_sphere",
            ["next_check_at"],
            unique=False,
            postgresql_where=sa.text(_UNDECIDED),
            sqlite_where=sa.text(_UNDECIDED),
        )
    if not inspector.has_table("condmsg_sphere_participant"):
        op.create_table(
            "condmsg_sphere_participant",
            sa.Column("sphere_id", sa.String(length=36), nullable=False),
            sa.Column("participant_id", sa.String(length=200), nullable=False),
            sa.Column("kind", sa.String(length=16), nullable=False),
            sa.Column("resource", sa.Text(), nullable=False),
            sa.Column("args_json", sa.Text(), nullable=True),
            sa.Column("run_on", sa.String(length=16), nullable=True),
            sa.Column("state", sa.String(length=16), nullable=False),
            sa.Column("enlisted_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("detail", sa.Text(), nullable=True),
            sa.ForeignKeyConstraint(["sphere_id"], ["condmsg_sphere.sphere_id"]),
            sa.PrimaryKeyConstraint("sphere_id", "participant_id"),
        )


def downgrade() -> None:
    op.drop_table("condmsg_sphere_participant")
    op.drop_index("ix_condmsg_sphere_due", table_name="condmsg_sphere")
    op.drop_table("condmsg_sphere")
    op.drop_index("ix_condmsg_cm_sphere_id", table_name="condmsg_cm")
