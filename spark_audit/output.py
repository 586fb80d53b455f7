"""The audit's tables under ``tables/``: their writer and the schemas of the small ones.

Every location is a Hadoop URI (``file://``, ``hdfs://``, ``s3a://``) or a plain path. A
detail table with more than :data:`DRIVER_ROWS` rows is written straight from its query
by Spark's Parquet writer, on the executors. The other tables are small and already on
the driver (collected rows, or rows computed there): each is written as one Parquet file
through Hadoop's FileSystem API (:func:`spark_audit.storage.write_parquet`), in the
layout Spark's writer leaves, because a Spark job per table would cost more than the
audit's work on a small input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from spark_audit import storage
from spark_audit.settings import one_shuffle_partition
from spark_audit.storage import child

#: A detail table with at most this many rows is collected and written by the driver.
DRIVER_ROWS = 200_000
#: Small tables written at the same time (:class:`TableWriter`).
BACKGROUND_WRITES = 4
#: Detail tables whose first rows the report shows.
SAMPLED_TABLES = (
    "discrepancies",
    "late_ack_effects",
    "status_mismatches",
    "stale_pending",
    "sphere_discrepancies",
    "sphere_early_releases",
)
SAMPLE_ROWS = 50
UTC = "UTC"
#: The column naming each row's table in :meth:`TableWriter.frames`' one query.
_TABLE = "_table"

# -- small tables: their Arrow schemas ---------------------------------------------------

_F64, _I64, _STR = pa.float64(), pa.int64(), pa.string()
_TS = pa.timestamp("us", tz=UTC)
_RATES = [("success_rate", _F64), ("failure_rate", _F64), ("compensation_rate", _F64)]
_OUTCOMES = [("satisfied", _I64), ("violated", _I64), ("pending", _I64)]
_LATENCY = [
    ("destination", _STR),
    ("recipient", _STR),
    ("level", _STR),
    ("acks", _I64),
    ("commit_acks", _I64),
    *((f"{m}_p{p}_ms", _F64) for m in ("pickup", "process", "work", "relay") for p in (50, 90, 99)),
]
SMALL_SCHEMAS: dict[str, pa.Schema] = {
    "latency": pa.schema(_LATENCY),
    "latency_histogram": pa.schema([("metric", _STR), ("bin", pa.int32()), ("count", _I64)]),
    "receivers": pa.schema(
        [
            ("receiver", _STR),
            ("acks", _I64),
            ("offset_upper_ms", _F64),
            ("offset_lower_ms", _F64),
            ("relay_p50_ms", _F64),
            ("relay_p90_ms", _F64),
            ("relay_p99_ms", _F64),
            ("behind_by_at_least_ms", _F64),
            ("ahead_by_at_least_ms", _F64),
            ("skew_proved", pa.bool_()),
        ]
    ),
    "rates_by_sender": pa.schema(
        [("sender", _STR), ("cms", _I64), *_OUTCOMES, ("compensated", _I64), *_RATES]
    ),
    "rates_by_shape": pa.schema(
        [("shape", _STR), ("cms", _I64), *_OUTCOMES, ("compensated", _I64), *_RATES]
    ),
    "destinations": pa.schema(
        [
            ("destination", _STR),
            ("copies", _I64),
            *_OUTCOMES,
            ("compensated", _I64),
            ("pickup_deadlines", _I64),
            ("pickup_misses", _I64),
            ("process_deadlines", _I64),
            ("process_misses", _I64),
            *_RATES,
            ("pickup_miss_rate", _F64),
            ("process_miss_rate", _F64),
        ]
    ),
    "outcomes_over_time": pa.schema([("bucket_start", _TS), *_OUTCOMES]),
    "anomaly_counts": pa.schema([("kind", _STR), ("count", _I64)]),
}
CM_SCHEMAS: dict[str, pa.Schema] = {
    "late_ack_effects": pa.schema(
        [
            ("cm_id", _STR),
            ("late_acks", _I64),
            ("stored_verdict", _STR),
            ("verdict_counted", _STR),
            ("verdict_with_late", _STR),
            ("changes_verdict", pa.bool_()),
            ("flagged", pa.bool_()),
        ]
    ),
    "stale_pending": pa.schema(
        [("cm_id", _STR), ("sender", _STR), ("sent_at", _TS), ("evaluation_deadline", _TS)]
    ),
    "invalid_conditions": pa.schema(
        [("cm_id", _STR), ("sender", _STR), ("condition_json", _STR), ("error", _STR)]
    ),
}
#: The sphere tables (:mod:`spark_audit.sphere_audit`), written with these schemas when
#: the window has no spheres; ``tests/spark/test_spheres.py`` holds them to the frames'.
SPHERE_SCHEMAS: dict[str, pa.Schema] = {
    "sphere_discrepancies": pa.schema(
        [
            ("sphere_id", _STR),
            ("sender", _STR),
            ("stored_verdict", _STR),
            ("recomputed_verdict", _STR),
            ("agrees", pa.bool_()),
            ("recomputed_reason", _STR),
            ("deadline", _TS),
            ("committed_at", _TS),
            ("aborted_at", _TS),
            ("decided_at", _TS),
            ("effective_at", _TS),
            ("members_recorded", pa.int32()),
            ("members_found", _I64),
            ("members_satisfied_in_time", _I64),
            ("members_violated", _I64),
            ("stored_reasons_json", _STR),
        ]
    ),
    "sphere_early_releases": pa.schema(
        [
            ("sphere_id", _STR),
            ("cm_id", _STR),
            ("destination", _STR),
            ("released_at", _TS),
            ("sphere_decided_at", _TS),
        ]
    ),
}
DISCREPANCY_SCHEMA = pa.schema(
    [
        ("cm_id", _STR),
        ("sender", _STR),
        ("shape", _STR),
        ("stored_verdict", _STR),
        ("recomputed_verdict", _STR),
        ("path", _STR),
        ("python_verdict", _STR),
        ("decided_at", _TS),
        ("effective_at", _TS),
        ("counted_acks", _I64),
        ("reasons", pa.list_(_STR)),
        ("stored_reasons_json", _STR),
        ("error", _STR),
    ]
)


class Tables(Mapping[str, DataFrame]):
    """The audit's tables as frames by name. A table held by the driver becomes a frame
    only when asked for (a frame of local rows costs the driver a plan), then stays one."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.frames: dict[str, DataFrame] = {}
        self.local: dict[str, pa.Table] = {}

    def __getitem__(self, name: str) -> DataFrame:
        if name not in self.frames:
            self.frames[name] = self.spark.createDataFrame(self.local[name])
        return self.frames[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**self.local, **self.frames})

    def __len__(self) -> int:
        return len({**self.local, **self.frames})


class TableWriter:
    """Writes the tables under ``root`` (a path or URI; None: writes nothing) and keeps
    each as a frame (:attr:`tables`), with its row count and samples.

    The tables on the driver are written in the background (:data:`BACKGROUND_WRITES` at
    a time): on an object store each file is a few requests, which the audit's next
    steps need not wait for. :meth:`wait` for them before relying on the files;
    :meth:`close` in any case."""

    def __init__(self, spark: SparkSession, root: str | None) -> None:
        self.spark = spark
        self.root = root
        self.tables = Tables(spark)
        self.counts: dict[str, int] = {}
        self.collected: dict[str, list[dict[str, Any]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def wait(self) -> None:
        """Every table written so far is on storage (the first failed write raises)."""
        pending, self._pending = self._pending, []
        for write in pending:
            write.result()

    def close(self) -> None:
        """Wait for the writes still running and stop their threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _write_later(self, table: pa.Table, location: str) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(BACKGROUND_WRITES, "condmsg-audit-write")
        self._pending.append(self._pool.submit(storage.write_parquet, self.spark, location, table))

    def rows(self, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
        self.arrow(name, pa.Table.from_pylist(rows, schema=schema), keep_all=True)

    def arrow(self, name: str, table: pa.Table, *, keep_all: bool = False) -> None:
        """A table computed on the driver, written as one file."""
        self.tables.local[name] = table
        if self.root is not None:
            self._write_later(table, child(self.root, name))
        self.counts[name] = table.num_rows
        if keep_all:
            self.collected[name] = table.to_pylist()
        elif name in SAMPLED_TABLES and table.num_rows:
            self.collected[name] = table.slice(0, SAMPLE_ROWS).to_pylist()

    def frames(self, tables: Mapping[str, tuple[DataFrame, int]]) -> None:
        """Detail tables (name -> frame and an upper bound of its rows), each written as
        by :meth:`frame`; those the driver writes are collected by one query together
        (one job and one plan instead of one per table)."""
        small = {name: frame for name, (frame, n) in tables.items() if 0 < n <= DRIVER_ROWS}
        for name, (frame, expected) in tables.items():
            if name not in small:
                self.frame(name, frame, expected)
        if len(small) == 1:
            ((name, frame),) = small.items()
            self.arrow(name, frame.toArrow())
        if len(small) < 2:
            return
        parts = [
            frame.select(F.lit(name).alias(_TABLE), *(F.col(c) for c in frame.columns))
            for name, frame in small.items()
        ]
        union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
        with one_shuffle_partition(union.sparkSession):
            collected = union.toArrow()
        for name, frame in small.items():
            mine = collected.filter(pc.equal(collected.column(_TABLE), name))
            schema = to_arrow_schema(frame.schema, timezone=UTC)
            self.arrow(name, mine.select(frame.columns).cast(schema))

    def frame(self, name: str, frame: DataFrame, expected: int) -> None:
        """A detail table: ``expected`` (an upper bound of) its rows decides the writer."""
        if expected == 0:
            schema = to_arrow_schema(frame.schema, timezone=UTC)
            self.arrow(name, schema.empty_table())
        elif expected <= DRIVER_ROWS:
            self.arrow(name, frame.toArrow())
        elif self.root is None:
            self.tables.frames[name] = frame
            self.counts[name] = frame.count()
            if name in SAMPLED_TABLES and self.counts[name]:
                rows = frame.limit(SAMPLE_ROWS).collect()
                self.collected[name] = [r.asDict(recursive=True) for r in rows]
        else:
            path = child(self.root, name)
            frame.write.mode("overwrite").parquet(path)
            written = frame.sparkSession.read.parquet(path)
            self.tables.frames[name] = written
            self.counts[name] = written.count()
            if name in SAMPLED_TABLES and self.counts[name]:
                rows = written.limit(SAMPLE_ROWS).collect()
                self.collected[name] = [r.asDict(recursive=True) for r in rows]
