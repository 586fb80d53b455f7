"""Failed processing attempts per message, and the pause before the next one.

Classic queues do not count redeliveries, so the receiver counts the failed attempts of a
message by its AMQP message id in ``condmsg_poison``, outside the rolled-back transaction:
every receiver process sharing the store sees the same count. When that write fails too
(the database is what failed), the attempt is kept in memory and added to the row at the
next write that works, so an outage does not reset a poison message's count.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ackd.tables import POISON_ID_LENGTH, poison
from condmsg.infra.backoff import retry_delay_s

log = logging.getLogger(__name__)

#: Defaults of the ``Receiver``'s retry settings: the pauses double from 200 ms up to 5 s,
#: so the five attempts of a failing message span about 3 s (0.2 + 0.4 + 0.8 + 1.6).
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF = timedelta(milliseconds=200)
DEFAULT_BACKOFF_MAX = timedelta(seconds=5)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a message is tried and how long it waits between two attempts."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: timedelta = DEFAULT_BACKOFF
    backoff_max: timedelta = DEFAULT_BACKOFF_MAX

    def delay_s(self, attempts: int) -> float:
        """Seconds to hold a message back after its ``attempts``-th failure: none once it
        is exhausted (its next reading dead-letters it), else doubling up to the cap."""
        if attempts >= self.max_attempts or attempts < 1:
            return 0.0
        return retry_delay_s(
            attempts,
            initial_s=self.backoff.total_seconds(),
            maximum_s=self.backoff_max.total_seconds(),
        )


def poison_key(message_id: str | bytes) -> str:
    """The counts' key of an AMQP message id: the id itself, or a digest of an id its
    column cannot hold (over 128 characters, with a NUL or a lone surrogate, or not UTF-8:
    pika hands such a short string over as bytes). AMQP allows ids of 255 bytes."""
    if isinstance(message_id, str):
        if len(message_id) <= POISON_ID_LENGTH and "\x00" not in message_id:
            try:
                message_id.encode("utf-8")  # a lone surrogate no database text can hold
            except UnicodeEncodeError:
                pass
            else:
                return message_id
        raw = message_id.encode("utf-8", "surrogatepass")
    else:
        raw = bytes(message_id)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


@dataclass(slots=True)
class Unsaved:
    attempts: int
    error: str


class AttemptCounts:
    """The failed attempts of messages, in the receiver store with an in-memory fallback."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._unsaved: dict[str, Unsaved] = {}

    def record(self, keys: Iterable[str], error: str, now: datetime) -> dict[str, int]:
        """Count one more failed attempt of each key; returns each key's total."""
        keys = list(dict.fromkeys(keys))
        for key in keys:
            unsaved = self._unsaved.setdefault(key, Unsaved(0, error))
            unsaved.attempts += 1
            unsaved.error = error
        try:
            totals = self._write({key: self._unsaved[key] for key in keys}, now)
        except sa.exc.SQLAlchemyError as exc:
            log.warning(
                "could not count failed attempts of %d message(s) in the receiver store "
                "(%s); counted in this process until it works again",
                len(keys),
                type(exc).__name__,
            )
            return {key: self._unsaved[key].attempts for key in keys}
        for key in keys:
            del self._unsaved[key]
        return totals

    def unsaved(self, key: str) -> Unsaved | None:
        """Attempts of ``key`` counted in memory only (the store could not take them)."""
        return self._unsaved.get(key)

    def forget(self, key: str) -> None:
        self._unsaved.pop(key, None)

    def dead_letter_reason(
        self, session: Session, message_id: str | bytes, max_attempts: int
    ) -> str | None:
        """The dead-letter reason of a message whose processing failed ``max_attempts``
        times (its count is then cleared), or None.

        Runs in the transaction's own session: on SQLite a second connection would wait for
        the write lock this transaction holds.
        """
        key = poison_key(message_id)
        row = session.execute(
            sa.select(poison.c.attempts, poison.c.last_error).where(poison.c.message_id == key)
        ).first()
        unsaved = self._unsaved.get(key)
        attempts = (row.attempts if row is not None else 0) + (unsaved.attempts if unsaved else 0)
        if attempts < max_attempts:
            return None
        if row is not None:
            session.execute(sa.delete(poison).where(poison.c.message_id == key))
        self.forget(key)
        last_error = unsaved.error if unsaved else row.last_error if row is not None else None
        return f"poison message: processing failed {attempts} times: {last_error}"

    def _write(self, counts: dict[str, Unsaved], now: datetime) -> dict[str, int]:
        totals: dict[str, int] = {}
        with Session(self._engine) as session, session.begin():
            for key, unsaved in counts.items():
                updated: Any = session.execute(
                    sa.update(poison)
                    .where(poison.c.message_id == key)
                    .values(
                        attempts=poison.c.attempts + unsaved.attempts,
                        last_error=unsaved.error,
                        updated_at=now,
                    )
                    .returning(poison.c.attempts)
                ).first()
                if updated is None:
                    session.execute(
                        sa.insert(poison).values(
                            message_id=key,
                            attempts=unsaved.attempts,
                            last_error=unsaved.error,
                            updated_at=now,
                        )
                    )
                    totals[key] = unsaved.attempts
                else:
                    totals[key] = int(updated.attempts)
        return totals
