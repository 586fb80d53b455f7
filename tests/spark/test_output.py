"""The audit's table writer: detail tables collected by one query, or written by Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spark_audit import output
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
