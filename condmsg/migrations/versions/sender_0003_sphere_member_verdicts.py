"""Dependency-Spheres: each decided sphere keeps its members' verdicts as its decision saw
them (``condmsg_sphere.member_verdicts_json``), so that its outcome reads the same later.

A sphere decided before this revision gets them from its members' decision instants: a
member decided at or before the sphere's decision with its verdict, any other as
``pending``. A store that ``create_all`` made with the column already keeps it.

Revision ID: sender_0003
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "sender_0003"
down_revision = "sender_0002"
branch_labels = None
depends_on = None

_DECIDED = ("satisfied", "violated")
_BATCH = 1000

_spheres = sa.table(
    "condmsg_sphere",
    sa.column("sphere_id", sa.String()),
    sa.column("state", sa.String()),
    sa.column("decided_at", sa.DateTime(timezone=True)),
    sa.column("member_verdicts_json", sa.Text()),
)
_cms = sa.table(
    "condmsg_cm",
    sa.column("cm_id", sa.String()),
    sa.column("sphere_id", sa.String()),
    sa.column("state", sa.String()),
    sa.column("decided_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    bind = op.get_bind()
    columns = {c["name"] for c in sa.inspect(bind).get_columns("condmsg_sphere")}
    if "member_verdicts_json" not in columns:
        op.add_column("condmsg_sphere", sa.Column("member_verdicts_json", sa.Text(), nullable=True))
    _fill(bind)


def _fill(bind: sa.Connection) -> None:
    """The member verdicts of the decided spheres that have none."""
    s, c = _spheres.c, _cms.c
    missing = sa.and_(s.state.in_(_DECIDED), s.member_verdicts_json.is_(None))
    found: dict[str, dict[str, str]] = {
        sphere_id: {} for sphere_id in bind.scalars(sa.select(s.sphere_id).where(missing))
    }
    if not found:
        return
    then = sa.case((c.decided_at <= s.decided_at, c.state), else_=sa.literal("pending"))
    members = sa.select(c.sphere_id, c.cm_id, then).join(_spheres, c.sphere_id == s.sphere_id)
    for sphere_id, cm_id, state in bind.execute(members.where(missing)):
        found[sphere_id][cm_id] = state
    update = (
        sa.update(_spheres)
        .where(s.sphere_id == sa.bindparam("id"))
        .values(member_verdicts_json=sa.bindparam("verdicts"))
    )
    rows = [
        {"id": sphere_id, "verdicts": json.dumps(members, sort_keys=True)}
        for sphere_id, members in found.items()
    ]
    for start in range(0, len(rows), _BATCH):
        bind.execute(update, rows[start : start + _BATCH])


def downgrade() -> None:
    op.drop_column("condmsg_sphere", "member_verdicts_json")
