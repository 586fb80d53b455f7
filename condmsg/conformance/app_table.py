"""The app table of the conformance contract: what the receiver under test handed over.

The receiver under test writes one row per message its application got, in the
transaction that delivers it (docs/conformance.md), so that "what the app received" is
exactly what committed: a message rolled back is not there, and one delivered twice is
there twice.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

TABLE_NAME = "conformance_received"

metadata = sa.MetaData()

received = sa.Table(
    TABLE_NAME,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    # original, compensation, success or plain (a message without condmsg headers).
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("cm_id", sa.String(36)),
    sa.Column("destination", sa.String(255)),
    sa.Column("message_id", sa.String(255)),
    sa.Column("body", sa.LargeBinary(), nullable=False),
    sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)

KINDS = ("original", "compensation", "success", "plain")


def create(engine: Engine) -> None:
    """Create the app table if missing, and empty it: a run judges only its own rows."""
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(received.delete())


def rows(engine: Engine) -> list[sa.Row[tuple[object, ...]]]:
    """Every row handed over so far, oldest first."""
    with engine.connect() as conn:
        return list(conn.execute(sa.select(received).order_by(received.c.id)))


def count(engine: Engine, kind: str) -> int:
    """How many rows of ``kind`` were handed over so far."""
    query = sa.select(sa.func.count()).select_from(received).where(received.c.kind == kind)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())
