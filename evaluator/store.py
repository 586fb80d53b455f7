"""The evaluator's port onto the sender store (``condmsg.tables``): its protocols and
the rows they hand back.

Two adapters serve it: :class:`evaluator.store_sqlalchemy.SqlAlchemyDecisionStore` (any
database SQLAlchemy speaks) and :class:`evaluator.store_psycopg.PsycopgDecisionStore`
(PostgreSQL through psycopg 3: one statement per batch, array parameters). The evaluator's
:class:`evaluator.store_setup.SenderStore` picks one when it is built.

Every method takes the caller's session and never commits: the service stores a batch of
acks, decides, and writes the outcome actions to the outbox in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core.acks import Ack
from condmsg.core.condition_codec import condition_from_json
from condmsg.core.conditions import Condition
from condmsg.core.timeutil import stored_instant

#: The keys of an ack row for :meth:`AckStore.insert_acks`: the ``condmsg_ack`` columns.
ACK_ROW_KEYS = tuple(tables.acks.c.keys())
#: The keys of a decision row for :meth:`CmStore.decide_many`: what may differ between the
#: CMs decided by one call (the decision instant and the instance are the call's).
DECISION_ROW_KEYS = ("cm_id", "state", "effective_at", "reasons_json", "facts_json")
#: Rows to write, each keyed by a table's column names.
Rows = Sequence[Mapping[str, Any]]


@lru_cache(maxsize=4096)
def parse_condition(document: str) -> Condition:
    """Conditions repeat across CMs of one shape; decoding each once is enough."""
    return condition_from_json(document)


#: A stored instant as an aware UTC datetime.
to_utc = stored_instant


class CmRow(NamedTuple):
    """What the evaluator needs of a CM row (a tuple: thousands are built per second)."""

    cm_id: str
    sender: str
    sent_at: datetime
    condition: Condition
    state: str
    notify_success: bool
    effective_at: datetime | None
    #: The Dependency-Sphere it belongs to: its outcome actions follow the sphere's.
    sphere_id: str | None = None

    @classmethod
    def of(cls, row: Any) -> CmRow:
        return cls(
            cm_id=row.cm_id,
            sender=row.sender,
            sent_at=to_utc(row.sent_at),
            condition=parse_condition(row.condition_json),
            state=row.state,
            notify_success=row.notify_success,
            effective_at=to_utc(row.effective_at) if row.effective_at is not None else None,
            sphere_id=row.sphere_id,
        )


class CopyRow(NamedTuple):
    """What the evaluator needs of a copy: who may ack it, and where notices go."""

    destination: str
    recipient: str | None
    exchange: str
    routing_key: str


class CompensationRow(NamedTuple):
    """A stored compensation: what a violated CM sends to one of its destinations."""

    destination: str
    body: bytes
    content_type: str | None


class AckStore(Protocol):
    """The acks the evaluator stores and counts, and the anomalies it records."""

    def insert_acks(self, session: Session, rows: Rows) -> set[str]:
        """Store acks (rows keyed by :data:`ACK_ROW_KEYS`) idempotently on ``ack_id``;
        returns the ack ids this call inserted (the rest were stored before: duplicates)."""
        ...

    def counted_acks(self, session: Session, cm_ids: Iterable[str]) -> dict[str, list[Ack]]:
        """Per CM, the acks that count for it (status ``counted``: stored before its
        decision)."""
        ...

    def late_acks(
        self, session: Session, cm_ids: Iterable[str]
    ) -> dict[str, list[tuple[Ack, str]]]:
        """Per CM, the acks stored after its decision, with their status
        (``after_decision`` or ``changes_verdict``), in the order they were received."""
        ...

    def record_anomalies(self, session: Session, rows: Rows) -> None:
        """Insert ``condmsg_anomaly`` rows (keyed by its columns, without ``id``)."""
        ...


class CmStore(Protocol):
    """The CM rows the evaluator decides, their copies and their compensations."""

    def load_cms(
        self, session: Session, cm_ids: Iterable[str], *, lock: bool = False
    ) -> dict[str, CmRow]:
        """The CM rows for ``cm_ids`` (unknown ids are left out). With ``lock``, the rows
        are locked until the transaction ends, in id order (Python's sort, the same in
        every instance), so that two instances deciding overlapping batches queue behind
        each other instead of deadlocking."""
        ...

    def copies_of(self, session: Session, cm_ids: Iterable[str]) -> dict[str, dict[str, CopyRow]]:
        """Per CM, its copies by destination name."""
        ...

    def decide_many(
        self, session: Session, rows: Rows, *, instance: str, decided_at: datetime
    ) -> set[str]:
        """Record verdicts exactly once (rows keyed by :data:`DECISION_ROW_KEYS`;
        ``effective_at`` is each CM's, clamped to its ``sent_at``); returns the CM ids whose
        verdict this call wrote.

        Only a pending CM is decided, and its next check is cleared. Of two evaluator
        instances racing on one CM, the second decides nothing and loses cleanly (it rolls
        nothing back; its outcome actions are simply not written)."""
        ...

    def set_next_checks(
        self, session: Session, rows: Sequence[tuple[str, datetime | None]]
    ) -> None:
        """Set ``(cm_id, next_check_at)`` on the CMs still pending (decided ones keep
        none)."""
        ...

    def claim_due(self, session: Session, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` pending CMs whose next check is at or before ``now``, earliest
        first. Where the database locks rows, they are locked and rows another
        transaction holds are skipped: several instances sweep at once, each taking the
        due CMs nobody else holds."""
        ...

    def next_check(self, session: Session, after: datetime | None = None) -> datetime | None:
        """The earliest next check of the pending CMs (later than ``after``, if given), as
        an aware UTC instant; None if there is none."""
        ...

    def compensations_of(
        self, session: Session, cm_ids: Iterable[str]
    ) -> dict[str, list[CompensationRow]]:
        """Per CM, its stored compensations."""
        ...

    def release_compensations(self, session: Session, cm_ids: Iterable[str], at: datetime) -> None:
        """Mark the compensations of ``cm_ids`` released at ``at``."""
        ...


class DecisionStore(AckStore, CmStore, Protocol):
    """Everything the evaluator reads and writes in the sender store: one object, held by
    the evaluator and handed to intake, decisions and sweeps."""
