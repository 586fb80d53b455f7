"""Reading the sender store from PostgreSQL through Spark's JDBC source.

Reading once. An audit reads through :func:`jdbc_input`, which persists each table as read
for the run: its several passes over the CMs and the acks then read PostgreSQL once.

Partitioning. One partition per core Spark runs tasks on (``--jdbc-partitions`` to
change). ``cm_id`` is a UUID string, so Spark's numeric ``partitionColumn`` does not
apply. Every table but the anomalies carries ``cm_id`` under a B-tree index (the primary
keys of ``condmsg_cm``/``condmsg_copy``/``condmsg_compensation``, ``ix`` on
``condmsg_ack.cm_id``), so the reads are split into *ranges of cm_id*: the bounds come from a
cheap ``min``/``max`` over the window (answered from the index), the first 8 hex digits of
the two bounds are interpolated into ``partitions`` equal ranges, and each partition reads
``cm_id >= lo AND cm_id < hi``. UUIDs are uniform, so the ranges are balanced, each is an
index range scan, and the acks and CMs of one CM land in the same range. Ids that are not
hex fall back to ``hashtext(cm_id)`` buckets (balanced, but each partition scans the table).
The anomalies have a numeric ``id``: they use Spark's ``partitionColumn`` with bounds from
``min(id)``/``max(id)``. The spheres (one row per sphere, a small table) are read in one
partition.

The window is pushed into the SQL (``sent_at`` range, ``received_at``/``recorded_at <=
until``, acks of CMs in the window or orphans) so PostgreSQL returns only the cut;
:func:`spark_audit.readers.apply_window` then applies the per-row rules in Spark (a
decision or a release after ``until`` is not visible yet).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from urllib.parse import parse_qs, unquote, urlsplit

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from condmsg.archive.layout import ACKS, ANOMALIES, CMS, COMPENSATIONS, COPIES, SPHERES, Table
from spark_audit.readers import AuditInput, Window, apply_window
from spark_audit.schemas import conform
from spark_audit.settings import least_partitions

DEFAULT_FETCHSIZE = 10_000
_HEX8 = re.compile(r"^[0-9a-f]{8}")


@dataclass(frozen=True, slots=True)
class JdbcSource:
    """A JDBC URL and connection properties (the password never appears in messages)."""

    url: str
    user: str | None = None
    password: str | None = None
    #: Rows PostgreSQL sends per round trip (pgjdbc's ``fetchsize``; it streams only
    #: with one set, else it holds the whole result in the executor's memory).
    fetchsize: int = DEFAULT_FETCHSIZE
    #: Parallel reads per table (None: one per core Spark runs tasks on).
    partitions: int | None = None

    def properties(self) -> dict[str, str]:
        props = {"driver": "org.postgresql.Driver", "fetchsize": str(self.fetchsize)}
        if self.user:
            props["user"] = self.user
        if self.password:
            props["password"] = self.password
        return props

    def describe(self) -> str:
        return self.url


def jdbc_source(
    url: str, *, fetchsize: int = DEFAULT_FETCHSIZE, partitions: int | None = None
) -> JdbcSource:
    """A :class:`JdbcSource` from a ``jdbc:postgresql://`` or ``postgresql[+driver]://`` URL.

    A libpq/SQLAlchemy URL's user and password become properties, and its
    ``options=-csearch_path=S`` becomes pgjdbc's ``currentSchema=S``.
    """
    if url.startswith("jdbc:"):
        return JdbcSource(url, fetchsize=fetchsize, partitions=partitions)
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {parts.scheme}://...")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5432
    database = parts.path.lstrip("/") or "postgres"
    params: list[str] = []
    for option in parse_qs(parts.query).get("options", []):
        match = re.search(r"search_path=([^\s,]+)", unquote(option))
        if match:
            params.append(f"currentSchema={match.group(1)}")
    query = f"?{'&'.join(params)}" if params else ""
    return JdbcSource(
        f"jdbc:postgresql://{host}:{port}/{database}{query}",
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        fetchsize=fetchsize,
        partitions=partitions,
    )


def _ts(value: datetime) -> str:
    return f"TIMESTAMPTZ '{value.astimezone(UTC).isoformat()}'"


def _cm_window(window: Window, alias: str) -> str:
    clause = f"{alias}.sent_at < {_ts(window.until)}"
    if window.since is not None:
        clause += f" AND {alias}.sent_at >= {_ts(window.since)}"
    return clause


def _queries(window: Window) -> dict[str, str]:
    until = _ts(window.until)
    orphan_since = f" AND a.received_at >= {_ts(window.since)}" if window.since else ""
    recorded_since = f" AND recorded_at >= {_ts(window.since)}" if window.since else ""
    begun_since = f" AND begun_at >= {_ts(window.since)}" if window.since else ""
    return {
        CMS.name: f"SELECT m.* FROM {CMS.store_table} m WHERE {_cm_window(window, 'm')}",
        COPIES.name: (
            f"SELECT c.* FROM {COPIES.store_table} c JOIN {CMS.store_table} m "
            f"ON m.cm_id = c.cm_id WHERE {_cm_window(window, 'm')}"
        ),
        COMPENSATIONS.name: (
            "SELECT c.cm_id, c.destination, octet_length(c.body)::bigint AS body_bytes, "
            "c.content_type, c.system_generated, c.released_at "
            f"FROM {COMPENSATIONS.store_table} c JOIN {CMS.store_table} m "
            f"ON m.cm_id = c.cm_id WHERE {_cm_window(window, 'm')}"
        ),
        # Acks of CMs in the window, and orphans (no CM at all) received in the window.
        ACKS.name: (
            f"SELECT a.* FROM {ACKS.store_table} a LEFT JOIN {CMS.store_table} m "
            f"ON m.cm_id = a.cm_id WHERE a.received_at <= {until} AND "
            f"(({_cm_window(window, 'm')}) OR (m.cm_id IS NULL{orphan_since}))"
        ),
        ANOMALIES.name: (
            f"SELECT * FROM {ANOMALIES.store_table} WHERE recorded_at <= {until}{recorded_since}"
        ),
        SPHERES.name: (
            f"SELECT * FROM {SPHERES.store_table} WHERE begun_at < {until}{begun_since}"
        ),
    }


def cm_id_predicates(low: str | None, high: str | None, partitions: int) -> list[str]:
    """Disjoint predicates on ``cm_id`` that together cover every row (see module doc)."""
    if partitions <= 1 or low is None or high is None:
        return ["1 = 1"]
    if not (_HEX8.match(low) and _HEX8.match(high)):
        n = partitions
        return [f"(hashtext(cm_id)::bigint % {n} + {n}) % {n} = {i}" for i in range(n)]
    lo, hi = int(low[:8], 16), int(high[:8], 16)
    bounds = sorted({f"{lo + (hi - lo) * i // partitions:08x}" for i in range(1, partitions)})
    if not bounds:
        return ["1 = 1"]
    predicates = [f"cm_id < '{bounds[0]}'"]
    predicates += [f"cm_id >= '{a}' AND cm_id < '{b}'" for a, b in pairwise(bounds)]
    predicates.append(f"cm_id >= '{bounds[-1]}'")
    return predicates


def _read(spark: SparkSession, source: JdbcSource, sql: str, **kwargs: object) -> DataFrame:
    return spark.read.jdbc(
        source.url,
        f"({sql}) AS src",
        properties=source.properties(),
        **kwargs,
    )


def read_jdbc(spark: SparkSession, source: JdbcSource, window: Window) -> AuditInput:
    """The store's cut at ``window``, read in partitions (see the module doc). Every
    action on a frame reads PostgreSQL again: an audit reads through :func:`jdbc_input`."""
    return apply_window(AuditInput(**_tables(spark, source, window)), window, joined=False)


@contextmanager
def jdbc_input(spark: SparkSession, source: JdbcSource, window: Window) -> Iterator[AuditInput]:
    """:func:`read_jdbc`, each table read once: the tables as read are persisted (memory,
    spilling to the executors' local disks) while the block runs, so the audit's several
    passes over the CMs and the acks read PostgreSQL once per table."""
    tables = {
        name: frame.persist(StorageLevel.MEMORY_AND_DISK)
        for name, frame in _tables(spark, source, window).items()
    }
    try:
        yield apply_window(AuditInput(**tables), window, joined=False)
    finally:
        for frame in tables.values():
            frame.unpersist()


def _tables(spark: SparkSession, source: JdbcSource, window: Window) -> dict[str, DataFrame]:
    partitions = source.partitions or least_partitions(spark)
    queries = _queries(window)
    bounds = _read(
        spark,
        source,
        f"SELECT min(m.cm_id) AS lo, max(m.cm_id) AS hi FROM {CMS.store_table} m "
        f"WHERE {_cm_window(window, 'm')}",
    ).first()
    predicates = cm_id_predicates(
        bounds["lo"] if bounds else None, bounds["hi"] if bounds else None, partitions
    )
    frames: dict[str, DataFrame] = {}
    table: Table
    for table in (CMS, COPIES, ACKS, COMPENSATIONS):
        frames[table.name] = conform(
            _read(spark, source, queries[table.name], predicates=predicates), table
        )
    ids = _read(
        spark, source, f"SELECT min(id) AS lo, max(id) AS hi FROM ({queries[ANOMALIES.name]}) q"
    ).first()
    if ids is None or ids["lo"] is None or ids["lo"] == ids["hi"]:
        anomalies = _read(spark, source, queries[ANOMALIES.name])
    else:
        anomalies = _read(
            spark,
            source,
            queries[ANOMALIES.name],
            column="id",
            lowerBound=int(ids["lo"]),
            upperBound=int(ids["hi"]) + 1,
            numPartitions=partitions,
        )
    frames[ANOMALIES.name] = conform(anomalies, ANOMALIES)
    frames[SPHERES.name] = conform(_read(spark, source, queries[SPHERES.name]), SPHERES)
    return frames
