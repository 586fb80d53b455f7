"""PostgreSQL: the outbox table's autovacuum options, which keep it small under churn.

Every outbox row is inserted, claimed and deleted within milliseconds, so the table's
live rows are its backlog while its dead rows pile up at the rate of the traffic until a
vacuum reclaims their space for the next inserts. PostgreSQL's default trigger (dead rows
above 50 + 20 % of the row estimate) is scaled by an estimate that a backlog inflates
and that stays inflated after the backlog drained; a fixed threshold (scale factor 0)
vacuums the table at every autovacuum visit that finds 1,000 dead rows, whatever its past.
Without the cost delay, the vacuum of a table this small ends in milliseconds instead of
sleeping between pages while dead rows keep coming. SQLite reuses a deleted row's space
by itself: nothing to set there.

Revision ID: outbox_0002
"""

from __future__ import annotations

from alembic import op

revision = "outbox_0002"
down_revision = "outbox_0001"
branch_labels = None
depends_on = None

#: The same options as ``outbox.table`` gives a table it creates.
OPTIONS = (
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_cost_delay = 0"
)
RESET = "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE condmsg_outbox SET ({OPTIONS})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE condmsg_outbox RESET ({RESET})")
