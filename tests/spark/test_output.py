"""The audit's table writer: detail tables collected by one query, or written by Spark; the
tables on the driver written through Hadoop's FileSystem API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_audit import output, storage
from spark_audit.output import TableWriter
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)


def _read(root: Path, name: str) -> Any:
    return pq.read_table(root / name)


def test_small_tables_share_one_query_and_keep_their_schemas(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "DRIVER_ROWS", 2)
    ids = spark.createDataFrame([("a", 1), ("b", 2)], "ack_id string, n long")
    stamps = spark.sql("SELECT 'x' AS ack_id, TIMESTAMP'2024-01-01 00:00:00' AS at, 1.5D AS ms")
    big = spark.range(3).selectExpr("CAST(id AS INT) AS id", "array('p', 'q') AS ids")
    none = spark.createDataFrame([], "ack_id string, flag boolean")
    grouped = ids.groupBy((ids.n % 2).alias("odd")).count()
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    writer = TableWriter(spark, str(tmp_path))
    writer.frames(
        {
            "ids": (ids, 2),
            "stamps": (stamps, 1),
            "big": (big, 3),
            "none": (none, 0),
            "grouped": (grouped, 2),
        }
    )
    writer.wait()
    # The union ran with one shuffle partition; the session's setting is restored.
    assert spark.conf.get("spark.sql.shuffle.partitions") == partitions
    assert writer.counts == {"ids": 2, "stamps": 1, "big": 3, "none": 0, "grouped": 2}
    assert sorted(r["count"] for r in _read(tmp_path, "grouped").to_pylist()) == [1, 1]
    assert sorted(_read(tmp_path, "ids").to_pylist(), key=str) == [
        {"ack_id": "a", "n": 1},
        {"ack_id": "b", "n": 2},
    ]
    stamped = _read(tmp_path, "stamps")
    assert stamped.schema.names == ["ack_id", "at", "ms"]
    assert str(stamped.schema.field("at").type) == "timestamp[us, tz=UTC]"
    assert stamped.column("ms").to_pylist() == [1.5]
    # Over DRIVER_ROWS: written by Spark (a directory of part files).
    assert sorted(r["id"] for r in _read(tmp_path, "big").to_pylist()) == [0, 1, 2]
    assert _read(tmp_path, "none").schema.names == ["ack_id", "flag"]
    assert _read(tmp_path, "none").num_rows == 0


def test_one_small_table_is_collected_alone(spark: Any, tmp_path: Path) -> None:
    writer = TableWriter(spark, str(tmp_path))
    frame = spark.createDataFrame([("a",)], "ack_id string")
    writer.frames({"one": (frame, 1), "empty": (frame.limit(0), 0)})
    writer.close()
    assert writer.counts == {"one": 1, "empty": 0}
    assert _read(tmp_path, "one").to_pylist() == [{"ack_id": "a"}]


def test_a_driver_table_is_written_where_spark_reads_it_and_replaces_the_last(
    spark: Any, tmp_path: Path
) -> None:
    schema = pa.schema([("kind", pa.string()), ("at", pa.timestamp("us", tz="UTC"))])
    first = pa.Table.from_pylist([{"kind": "old", "at": None}] * 3, schema=schema)
    at = pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC"))
    second = pa.Table.from_pylist([{"kind": "new", "at": at.as_py()}], schema=schema)
    location = (tmp_path / "tables" / "kinds").as_uri()
    storage.write_parquet(spark, location, first)
    storage.write_parquet(spark, location, second)

    # (Hadoop's local filesystem adds a hidden ``.crc`` file beside each.)
    written = sorted(p.name for p in (tmp_path / "tables" / "kinds").iterdir() if p.name[0] != ".")
    assert written == sorted([storage.PART_FILE, storage.SUCCESS_FILE])
    read = spark.read.parquet(location)
    assert dict(read.dtypes) == {"kind": "string", "at": "timestamp"}
    assert [(r["kind"], r["at"].timestamp()) for r in read.collect()] == [("new", 1_700_000_000.0)]
    assert pq.read_table(tmp_path / "tables" / "kinds").to_pylist() == second.to_pylist()


def test_the_tables_on_the_driver_become_frames_when_asked_for(spark: Any, tmp_path: Path) -> None:
    writer = TableWriter(spark, None)
    writer.rows(
        "anomaly_counts",
        [{"kind": "duplicate", "count": 2}],
        output.SMALL_SCHEMAS["anomaly_counts"],
    )
    assert list(writer.tables) == ["anomaly_counts"] and not writer.tables.frames
    assert writer.tables["anomaly_counts"].collect()[0].asDict() == {
        "kind": "duplicate",
        "count": 2,
    }
    assert writer.tables["anomaly_counts"] is writer.tables["anomaly_counts"]
    assert not (tmp_path / "anomaly_counts").exists()  # no root: nothing written
