"""The audit's input layout: one table per sender-store table, one explicit schema each.

This module is the single source of truth for column names and types. It imports neither
pyspark nor pyarrow: :mod:`spark_audit.schemas` derives Spark ``StructType`` s from it and
:mod:`spark_audit.export` derives Arrow schemas, so the JDBC reader, the Parquet reader, the
exporter and the generator cannot drift apart.

Column names are those of :mod:`condmsg.sender_tables`. Two deliberate differences:

* ``compensations`` carries ``body_bytes`` (the size of the stored body) instead of the
  body itself: the audit needs to know a compensation exists and when it was released,
  never its content, and archives should not copy application payloads.
* ``outcomes`` is not a store table: it is the decision columns of ``condmsg_cm``
  (see :func:`spark_audit.readers.outcomes_of`).

Timestamps are UTC instants (Spark ``TIMESTAMP`` with ``spark.sql.session.timeZone=UTC``;
Arrow ``timestamp[us, tz=UTC]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from condmsg import sender_tables

#: Version of the Parquet layout written by ``condmsg export`` and ``spark_audit.generate``.
LAYOUT_VERSION = 1
#: Version of ``summary.json``.
SUMMARY_VERSION = 1
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
    sender_tables.cms.name,
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
    sender_tables.copies.name,
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
    sender_tables.acks.name,
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
    sender_tables.compensations.name,
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
    sender_tables.anomalies.name,
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

#: The input tables in dependency order (CMs first).
TABLES: tuple[Table, ...] = (CMS, COPIES, ACKS, COMPENSATIONS, ANOMALIES)
TABLES_BY_NAME = {t.name: t for t in TABLES}

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
