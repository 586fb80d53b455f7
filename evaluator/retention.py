"""Retention: CMs decided longer ago than the retention period are archived, then deleted.

A pass takes ``cutoff = now - older_than`` and works in bounded batches, one transaction
each:

1. claim up to ``batch`` CMs with ``decided_at < cutoff`` (a pending CM is never taken)
   that belong to no Dependency-Sphere, and up to ``batch`` decided spheres whose members
   were all decided before the cutoff, with those members: a sphere is judged from its
   members, so the two are archived together (a sphere with a participant whose work is
   still open stays, for the sender's recovery); on PostgreSQL ``FOR UPDATE SKIP
   LOCKED``, so several evaluator instances share the work without waiting for each other
   and never take the same CM or sphere;
2. claim up to ``batch`` *orphans*: anomalies and acks whose CM is not in the store (an
   ``unknown_cm`` anomaly, an anomaly without a CM id, an ack row left without its CM),
   recorded (anomalies) or received (acks) before the cutoff;
3. read everything of the claimed CMs: the CM rows with their decision columns (the
   outcomes), copies, compensations (their size; the layout never copies payloads), acks
   and anomalies, whatever their own age; and the claimed spheres' rows and participant
   rows (the participants, which the layout has no table for, go into the manifest's
   ``retention`` entry);
4. delete exactly those rows by primary key, and check that every delete removed as many
   rows as were read (a difference aborts the batch);
5. write them as one archive directory in the layout ``condmsg export`` writes
   (:mod:`evaluator.archive`: temporary directory, fsync, rename);
6. commit.

The archive is durable before the commit, so a failure at any step before the commit
(an unwritable archive directory, a full disk, a lost connection) rolls the deletes back:
nothing is deleted that is not archived. A crash between the rename and the commit leaves
the archive and the rows; the next pass archives those rows again (archives are
at-least-once, deletion exactly-once): deduplicate by primary key when merging archives.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from condmsg import tables
from condmsg.archive.layout import ACKS, ANOMALIES, CMS, COMPENSATIONS, COPIES, SPHERES, Table
from condmsg.core.errors import ConfigError, StoreError
from condmsg.core.store_values import ParticipantState, SphereState
from condmsg.core.timeutil import utcnow
from condmsg.runtime.db import describe_db_url
from evaluator.archive import write_archive

DEFAULT_BATCH = 1000
#: Ids per ``IN (...)`` list: far below SQLite's and psycopg's parameter limits.
_CHUNK = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """Keep decided CMs for ``older_than`` after their decision; archive them under
    ``archive``; at most ``batch`` CMs of no sphere, ``batch`` spheres with their members
    (and as many orphans of each kind) per archive."""

    older_than: timedelta
    archive: Path
    batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if self.older_than <= timedelta(0):
            raise ConfigError(f"the retention period must be positive, got {self.older_than}")
        if not 1 <= self.batch <= 100_000:
            raise ConfigError(f"the retention batch must be 1..100000 CMs, got {self.batch}")


@dataclass(frozen=True, slots=True)
class Archived:
    """One batch: its archive directory and the rows archived and deleted per layout table."""

    directory: Path
    rows: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


@dataclass(slots=True)
class _Claim:
    plain_cm_ids: list[str] = field(default_factory=list)  # CMs of no sphere
    sphere_ids: list[str] = field(default_factory=list)
    member_ids: list[str] = field(default_factory=list)  # the claimed spheres' CMs
    ack_ids: list[str] = field(default_factory=list)  # orphan acks
    anomaly_ids: list[int] = field(default_factory=list)  # orphan anomalies

    @property
    def cm_ids(self) -> list[str]:
        return self.plain_cm_ids + self.member_ids

    def more_after(self, limit: int) -> bool:
        """A full claim of any kind: there may be more of it after this batch."""
        claimed = (self.plain_cm_ids, self.sphere_ids, self.ack_ids, self.anomaly_ids)
        return any(len(ids) == limit for ids in claimed)


def retain(
    engine: Engine,
    policy: RetentionPolicy,
    *,
    clock: Callable[[], datetime] = utcnow,
    instance: str = "",
    should_stop: Callable[[], bool] = lambda: False,
    on_archived: Callable[[Archived], None] | None = None,
) -> list[Archived]:
    """One retention pass: batches until nothing is left before the cutoff (or
    ``should_stop``). Returns the archives written; raises on the first failed batch
    (whose rows stay in the store)."""
    started = clock()
    cutoff = started - policy.older_than
    done: list[Archived] = []
    orphans = True
    for number in itertools.count(1):
        if should_stop():
            break
        name = f"retention-{started:%Y%m%dT%H%M%S%fZ}-{number:04d}"
        archived, claim = _batch(engine, policy, cutoff, clock(), name, orphans, instance)
        if archived is not None:
            done.append(archived)
            if on_archived is not None:
                on_archived(archived)
        # Orphans are found by a scan (no index says "no CM"): once a batch held fewer
        # than a full claim of them, the rest of this pass does not look again.
        orphans = orphans and policy.batch in (len(claim.ack_ids), len(claim.anomaly_ids))
        if not claim.more_after(policy.batch):
            break
    return done


def _batch(
    engine: Engine,
    policy: RetentionPolicy,
    cutoff: datetime,
    now: datetime,
    name: str,
    orphans: bool,
    instance: str,
) -> tuple[Archived | None, _Claim]:
    try:
        with engine.connect() as conn, conn.begin():
            claim = _claim(conn, cutoff, policy.batch, orphans)
            rows = _collect(conn, claim)
            if not any(rows.values()):
                return None, claim
            participants = _participants(conn, claim.sphere_ids)
            _delete(conn, claim, rows, len(participants))
            extra = {
                "retention": {
                    "cutoff": cutoff.isoformat(),
                    "older_than_s": policy.older_than.total_seconds(),
                    "instance": instance,
                    "sphere_participants": participants,
                }
            }
            # Written while the deletes are uncommitted: if this raises, they roll back.
            directory = write_archive(
                policy.archive, name, rows, source=str(engine.url), until=now, extra=extra
            )
    except sa.exc.SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        raise StoreError(
            f"retention batch failed on {describe_db_url(str(engine.url))} "
            f"({type(exc).__name__}: {cause}); nothing of it was deleted"
        ) from exc
    return Archived(directory, {table: len(found) for table, found in rows.items()}), claim


def _claim(conn: Connection, cutoff: datetime, limit: int, orphans: bool) -> _Claim:
    # Every claim locks its rows ``FOR UPDATE SKIP LOCKED``: SQLAlchemy renders nothing of
    # it on SQLite, where the transaction's write lock already keeps other writers out.
    cm = tables.cms.c
    # decided_at >= sent_at, so ``sent_at < cutoff`` adds no condition but lets the scan
    # walk the sent_at index (there is none on decided_at) in order.
    cms = (
        sa.select(cm.cm_id)
        .where(
            cm.sent_at < cutoff,
            cm.decided_at < cutoff,
            cm.state != tables.CmState.PENDING.value,
            # A sphere's members go with their sphere (below).
            cm.sphere_id.is_(None),
        )
        .order_by(cm.sent_at)
        .limit(limit)
        # Locks the CM rows until commit: another instance's claim skips them, and intake
        # (which locks a CM before storing its acks) waits, then finds the CM gone and
        # records an unknown_cm anomaly instead of adding an ack to a deleted CM.
        .with_for_update(skip_locked=True)
    )
    claim = _Claim(
        plain_cm_ids=list(conn.scalars(cms)),
        sphere_ids=list(conn.scalars(_spheres(cutoff, limit))),
    )
    for chunk in _chunks(claim.sphere_ids):
        # The members of a claimed sphere: no other claim takes them (they belong to a
        # sphere this transaction holds), so the lock only waits for intake.
        members = sa.select(cm.cm_id).where(cm.sphere_id.in_(chunk)).with_for_update()
        claim.member_ids += conn.scalars(members)
    if not orphans:
        return claim
    ack, anomaly = tables.acks.c, tables.anomalies.c
    acks = (
        sa.select(ack.ack_id)
        .where(ack.received_at < cutoff, ~sa.exists().where(cm.cm_id == ack.cm_id))
        .with_for_update(skip_locked=True, of=tables.acks)
    )
    anomalies = (
        sa.select(anomaly.id)
        .where(
            anomaly.recorded_at < cutoff,
            sa.or_(anomaly.cm_id.is_(None), ~sa.exists().where(cm.cm_id == anomaly.cm_id)),
        )
        .order_by(anomaly.recorded_at)
        .with_for_update(skip_locked=True, of=tables.anomalies)
    )
    claim.ack_ids = list(conn.scalars(acks.limit(limit)))
    claim.anomaly_ids = list(conn.scalars(anomalies.limit(limit)))
    return claim


def _spheres(cutoff: datetime, limit: int) -> sa.Select[tuple[str]]:
    """Up to ``limit`` spheres decided before ``cutoff`` whose members were all decided
    before it too, and none of whose participants still has open work (``enlisted`` or
    ``prepared``: the sender's recovery finishes those from the sphere's row)."""
    sphere, cm = tables.spheres.c, tables.cms.c
    participant = tables.sphere_participants.c
    decided = [SphereState.SATISFIED.value, SphereState.VIOLATED.value]
    open_work = [ParticipantState.ENLISTED.value, ParticipantState.PREPARED.value]
    member_too_recent = sa.exists().where(
        cm.sphere_id == sphere.sphere_id, sa.or_(cm.decided_at.is_(None), cm.decided_at >= cutoff)
    )
    unfinished = sa.exists().where(
        participant.sphere_id == sphere.sphere_id, participant.state.in_(open_work)
    )
    return (
        sa.select(sphere.sphere_id)
        .where(
            sphere.state.in_(decided),
            sphere.decided_at < cutoff,
            ~member_too_recent,
            ~unfinished,
        )
        .order_by(sphere.begun_at)
        .limit(limit)
        .with_for_update(skip_locked=True, of=tables.spheres)
    )


def _participants(conn: Connection, sphere_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The participant rows of ``sphere_ids``, as JSON-ready dicts (instants in ISO 8601)."""
    table = tables.sphere_participants
    found: list[dict[str, Any]] = []
    for chunk in _chunks(sphere_ids):
        query = sa.select(table).where(table.c.sphere_id.in_(chunk))
        for row in conn.execute(query).mappings():
            found.append(
                {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
            )
    return found


def _projection(table: Table) -> list[sa.ColumnElement[Any]]:
    """The layout's columns of ``table`` from its store table (``body_bytes`` is the size of
    the stored compensation body, as ``condmsg export`` writes it)."""
    store = tables.metadata.tables[table.store_table]
    return [
        sa.func.length(store.c.body).label(name) if name == "body_bytes" else store.c[name]
        for name in table.column_names
    ]


def _select(conn: Connection, table: Table, key: str, ids: Sequence[Any]) -> list[Any]:
    """The rows of ``table`` whose ``key`` is in ``ids``, in layout column order."""
    store = tables.metadata.tables[table.store_table]
    found: list[Any] = []
    for chunk in _chunks(ids):
        query = sa.select(*_projection(table)).where(store.c[key].in_(chunk))
        found += conn.execute(query).all()
    return found


def _collect(conn: Connection, claim: _Claim) -> dict[str, list[Any]]:
    rows = {
        table.name: _select(conn, table, "cm_id", claim.cm_ids)
        for table in (CMS, COPIES, COMPENSATIONS, ACKS, ANOMALIES)
    }
    rows[ACKS.name] += _select(conn, ACKS, "ack_id", claim.ack_ids)
    rows[ANOMALIES.name] += _select(conn, ANOMALIES, "id", claim.anomaly_ids)
    rows[SPHERES.name] = _select(conn, SPHERES, "sphere_id", claim.sphere_ids)
    return rows


def _delete(conn: Connection, claim: _Claim, rows: dict[str, list[Any]], participants: int) -> None:
    """Delete exactly the rows read: acks and anomalies by their own keys (a row that
    appeared since is not in the archive, so it stays), the CM's dependants before the CM,
    a sphere's participants before the sphere (foreign keys)."""
    cm_ids = claim.cm_ids
    ack_ids = [row.ack_id for row in rows[ACKS.name]]
    anomaly_ids = [row.id for row in rows[ANOMALIES.name]]
    keys: list[tuple[sa.Table, str, list[Any], int]] = [
        (tables.acks, "ack_id", ack_ids, len(ack_ids)),
        (tables.anomalies, "id", anomaly_ids, len(anomaly_ids)),
        (tables.copies, "cm_id", cm_ids, len(rows[COPIES.name])),
        (tables.compensations, "cm_id", cm_ids, len(rows[COMPENSATIONS.name])),
        (tables.cms, "cm_id", cm_ids, len(rows[CMS.name])),
        (tables.sphere_participants, "sphere_id", claim.sphere_ids, participants),
        (tables.spheres, "sphere_id", claim.sphere_ids, len(rows[SPHERES.name])),
    ]
    for store, key, ids, expected in keys:
        deleted = 0
        for chunk in _chunks(ids):
            deleted += conn.execute(sa.delete(store).where(store.c[key].in_(chunk))).rowcount
        if deleted != expected:
            raise StoreError(
                f"retention read {expected} rows of {store.name} but would delete "
                f"{deleted}; the batch is rolled back"
            )


def _chunks(ids: Sequence[Any]) -> list[Sequence[Any]]:
    return [ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)]
