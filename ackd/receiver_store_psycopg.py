"""The receiver's store on PostgreSQL through psycopg 3: the transactional read path's two
statements travel with the ``BEGIN`` and the ``COMMIT`` the app's transaction sends anyway
(how, and what happens when the server forgets a prepared statement: :mod:`ackd.fastpath`).

Everything else is the portable adapter's SQLAlchemy Core, which PostgreSQL serves the
same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ackd import fastpath
from ackd.receiver_store import SqlAlchemyReceiverStore, StoreTraits
from condmsg.infra.backends import psycopg_connection
from outbox.enqueueing import row_values
from outbox.message import OutboxMessage

__all__ = ["PsycopgReceiverStore"]


class PsycopgReceiverStore(SqlAlchemyReceiverStore):
    """:class:`~ackd.receiver_store.ReceiverStore` with the claim of an original and the
    COMMIT acks as :mod:`ackd.fastpath` statements (stateless; what each connection has
    prepared is kept by the fast path, per connection)."""

    def attach(self, engine: Engine) -> StoreTraits:
        # The fast path must see the statements after which psycopg deallocates what it
        # prepared (a rollback among them) on every connection of the engine.
        fastpath.watch(engine)
        return super().attach(engine)

    def claim_original(self, session: Session, row: Mapping[str, Any]) -> bool:
        return fastpath.claim(_driver_connection(session), row)

    def commit_with_acks(self, session: Session, acks: Sequence[OutboxMessage]) -> None:
        if not acks:
            super().commit_with_acks(session, acks)
            return
        session.flush()  # the app's pending ORM objects are written before the acks
        now = datetime.now(UTC)
        statements = [fastpath.ack_statement(row_values(message, now)) for message in acks]
        fastpath.execute_and_commit(_driver_connection(session), statements)
        # The database transaction is committed; this ends the session's own bookkeeping (a
        # COMMIT with no transaction open is not sent).
        session.commit()


def _driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under ``session``, looked up once per session: the claim and
    the commit of a transaction both ask."""
    key = "condmsg.driver_connection"
    found: psycopg.Connection[Any] | None = session.info.get(key)
    if found is None:
        found = session.info[key] = psycopg_connection(session)
    return found
