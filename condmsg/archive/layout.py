"""The archive layout: the Parquet tables that ``condmsg export``, the evaluator's
retention archives and ``spark_audit.generate`` write and the Spark audit reads.

One table per sender-store table, one explicit schema each, plus ``_manifest.json``. This
module is the single source of truth for column names and types, and it is pure: it
imports neither pyspark nor SQLAlchemy (only pyarrow, for :func:`arrow_schema`), so the
Spark audit, the exporter and the evaluator's archiver share it without pulling in each
other's libraries. :mod:`spark_audit.schemas` derives Spark ``StructType`` s from it, so
the JDBC reader, the Parquet reader, the exporter and the generator cannot drift apart.

Column and table names are those of :mod:`condmsg.tables` (``tests/unit/
test_archive_layout.py`` checks that they agree). Three deliberate differences:

* ``compensations`` carries ``body_bytes`` (the size of the stored body) instead of the
  body itself: the audit needs to know a compensation exists and when it was released,
  never its content, and archives should not copy application payloads.
* the W3C ``traceparent`` of a CM's send and of an ack (``condmsg_cm.traceparent``,
  ``condmsg_ack.traceparent``) are not archived: they join live traces
  (docs/tracing.md), whose spans a tracing backend keeps for its own retention, and
  the audit judges nothing by them.
* ``outcomes`` is not a store table: it is the decision columns of ``condmsg_cm``
  (see :func:`spark_audit.readers.outcomes_of`).

``spheres`` is ``condmsg_sphere`` whole; its participants (``condmsg_sphere_participant``:
the prepared transactions and handlers a sphere's outcome drives) are not archived: a
sphere's verdict follows from its own row and its members' CM rows alone
(:mod:`condmsg.core.sphere_evaluation`), which is all the audit re-judges.

Timestamps are UTC instants (Spark ``TIMESTAMP`` with ``spark.sql.session.timeZone=UTC``;
Arrow ``timestamp[us, tz=UTC]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

# The values of ``acks.status`` and ``anomalies.kind``, re-exported for the audit.
from condmsg.core.store_values import AckStatus as AckStatus
from condmsg.core.store_values import AnomalyKind as AnomalyKind
from condmsg.core.timeutil import utcnow

if TYPE_CHECKING:
    import pyarrow as pa

#: Version of the Parquet layout written by ``condmsg export`` and ``spark_audit.generate``.
LAYOUT_VERSION = 1
#: Name of the file that describes an exported directory.
MANIFEST = "_manifest.json"

ColumnType = Literal["string", "timestamp", "long", "int", "bool"]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class Table:
    """One input table: its directory name in the layout and its store table."""

    name: str
    store_table: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


CMS = Table(
    "cms",
    "condmsg_cm",
    (
        Column("cm_id", "string", False),
        Column("sender", "string", False),
        Column("sent_at", "timestamp", False),
        Column("condition_json", "string", False),
        Column("evaluation_deadline", "timestamp", False),
        Column("content_type", "string"),
        Column("payload_size", "long"),
        Column("notify_success", "bool"),
        Column("sphere_id", "string"),
        Column("state", "string", False),
        Column("next_check_at", "timestamp"),
        Column("decided_at", "timestamp"),
        Column("effective_at", "timestamp"),
        Column("reasons_json", "string"),
        Column("facts_json", "string"),
        Column("decided_by", "string"),
    ),
)

COPIES = Table(
    "copies",
    "condmsg_copy",
    (
        Column("cm_id", "string", False),
        Column("destination", "string", False),
        Column("recipient", "string"),
        Column("message_id", "string", False),
        Column("exchange", "string", False),
        Column("routing_key", "string", False),
        Column("requires", "string", False),
        Column("parts", "int"),
    ),
)

ACKS = Table(
    "acks",
    "condmsg_ack",
    (
        Column("ack_id", "string", False),
        Column("cm_id", "string", False),
        Column("destination", "string", False),
        Column("recipient", "string"),
        Column("receiver", "string", False),
        Column("kind", "string", False),
        Column("read_at", "timestamp", False),
        Column("committed_at", "timestamp"),
        Column("received_at", "timestamp", False),
        Column("status", "string", False),
    ),
)

COMPENSATIONS = Table(
    "compensations",
    "condmsg_compensation",
    (
        Column("cm_id", "string", False),
        Column("destination", "string", False),
        Column("body_bytes", "long"),
        Column("content_type", "string"),
        Column("system_generated", "bool", False),
        Column("released_at", "timestamp"),
    ),
)

ANOMALIES = Table(
    "anomalies",
    "condmsg_anomaly",
    (
        Column("id", "long", False),
        Column("kind", "string", False),
        Column("cm_id", "string"),
        Column("ack_id", "string"),
        Column("destination", "string"),
        Column("recipient", "string"),
        Column("detail", "string", False),
        Column("recorded_at", "timestamp", False),
    ),
)

SPHERES = Table(
    "spheres",
    "condmsg_sphere",
    (
        Column("sphere_id", "string", False),
        Column("sender", "string", False),
        Column("begun_at", "timestamp", False),
        Column("deadline", "timestamp", False),
        Column("members", "int"),
        Column("state", "string", False),
        Column("committed_at", "timestamp"),
        Column("aborted_at", "timestamp"),
        Column("abort_reason", "string"),
        Column("next_check_at", "timestamp"),
        Column("decided_at", "timestamp"),
        Column("effective_at", "timestamp"),
        Column("reasons_json", "string"),
        Column("decided_by", "string"),
        Column("member_verdicts_json", "string"),
    ),
)

#: The tables of a CM's life, in dependency order (CMs first): those every archive holds,
#: the evaluator's retention archives (which archive decided CMs, never spheres) included.
TABLES: tuple[Table, ...] = (CMS, COPIES, ACKS, COMPENSATIONS, ANOMALIES)
#: Every table of the layout: ``condmsg export`` writes them all. An archive without a
#: ``spheres`` table (a retention archive, an export written before spheres were
#: exported) reads as one without spheres.
ALL_TABLES: tuple[Table, ...] = (*TABLES, SPHERES)
TABLES_BY_NAME = {t.name: t for t in ALL_TABLES}

#: The day partitions of ``condmsg export``'s layout: each table's partition column
#: (Hive-style directories ``<table>/<column>=YYYY-MM-DD/``, days in UTC). The CMs, their
#: copies and compensations by the day the CM was sent; the acks by the day they were
#: received; the anomalies by the day they were recorded; the spheres by the day they
#: were begun (a sphere's members are sent after it begins). An archive without
#: ``partitioning`` in its manifest holds each table as plain files (the evaluator's
#: retention archives, ``spark_audit.generate``).
PARTITION_COLUMNS: dict[str, str] = {
    "cms": "sent_day",
    "copies": "sent_day",
    "compensations": "sent_day",
    "acks": "received_day",
    "anomalies": "recorded_day",
    "spheres": "begun_day",
}

#: The decision columns of ``cms`` that make up the ``outcomes`` frame.
OUTCOME_COLUMNS = (
    "cm_id",
    "state",
    "decided_at",
    "effective_at",
    "reasons_json",
    "facts_json",
    "decided_by",
)


# -- Arrow schemas and the manifest --------------------------------------------------------


def arrow_schema(table: Table) -> pa.Schema:
    """The Arrow schema of ``table`` as the layout's Parquet files hold it. (pyarrow is
    imported here, on first use: the evaluator imports this module for its retention job,
    and its processes need not pay for pyarrow and numpy at start.)"""
    import pyarrow as pa

    types: dict[ColumnType, pa.DataType] = {
        "string": pa.string(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "long": pa.int64(),
        "int": pa.int32(),
        "bool": pa.bool_(),
    }
    return pa.schema([pa.field(c.name, types[c.type], c.nullable) for c in table.columns])


def _without_password(source: str) -> str:
    """``source`` with the password of a URL (``scheme://user:password@host``) as ``***``."""
    try:
        parts = urlsplit(source)
    except ValueError:
        return "<unparseable source>"
    if parts.password is None:
        return source
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def manifest(
    *,
    source: str,
    since: datetime | None,
    until: datetime,
    rows: dict[str, int],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``_manifest.json``: layout version, cut and row counts (credentials
    removed from ``source``)."""
    return {
        "layout_version": LAYOUT_VERSION,
        "source": _without_password(source),
        "since": since.isoformat() if since else None,
        "until": until.isoformat(),
        "exported_at": utcnow().isoformat(),
        "tables": rows,
        **(extra or {}),
    }


def write_manifest(
    directory: Path,
    *,
    source: str,
    since: datetime | None,
    until: datetime,
    rows: dict[str, int],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write :func:`manifest` as ``directory/_manifest.json``."""
    content = manifest(source=source, since=since, until=until, rows=rows, extra=extra)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).write_text(json.dumps(content, indent=2) + "\n")


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The ``_manifest.json`` of an exported directory, or None without one."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data
