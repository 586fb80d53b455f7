"""Tracing: a CM keeps the W3C ``traceparent`` of its send's span, and an ack the one it
carried (``condmsg_cm.traceparent``, ``condmsg_ack.traceparent``), so that the decision,
maybe taken much later by another evaluator process, joins the send's trace and links to
every ack that decided it. Rows stored before this revision have none (NULL), as have
rows stored with tracing off. A store that ``create_all`` made with the columns already
keeps them.

Revision ID: sender_0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "sender_0004"
down_revision = "sender_0003"
branch_labels = None
depends_on = None

_TABLES = ("condmsg_cm", "condmsg_ack")


def upgrade() -> None:
    bind = op.get_bind()
    for table in _TABLES:
        columns = {c["name"] for c in sa.inspect(bind).get_columns(table)}
        if "traceparent" not in columns:
            op.add_column(table, sa.Column("traceparent", sa.String(length=55), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "traceparent")
