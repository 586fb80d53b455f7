"""The audit's partitions: one per core Spark runs tasks on, more for many CMs, used by
every shuffle of the run whatever ``spark.sql.shuffle.partitions`` says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_audit import job
from spark_audit.generate import GenerateSpec, generate
from spark_audit.readers import Window, read_parquet
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

SHUFFLE = "spark.sql.shuffle.partitions"


def test_one_partition_per_core_and_more_for_many_cms(spark: Any) -> None:
    cores = spark.sparkContext.defaultParallelism
    assert job._partitions(spark, 0) == cores
    assert job._partitions(spark, cores * job.CMS_PER_PARTITION) == cores
    assert job._partitions(spark, 5 * job.CMS_PER_PARTITION + 1) == max(cores, 6)


@pytest.mark.parametrize(("given", "expected"), [(None, "2"), (3, "3")])
def test_the_run_uses_its_partitions_and_restores_the_session(
    spark: Any, tmp_path: Path, given: int | None, expected: str
) -> None:
    spec = GenerateSpec(cms=60, seed=5)
    generate(spark, spec, tmp_path / "store")
    seen: list[str] = []
    before = spark.conf.get(SHUFFLE)
    spark.conf.set(SHUFFLE, "7")
    try:
        options = job.AuditOptions(
            out=tmp_path / "audit",
            window=Window(until=spec.until),
            source="test",
            partitions=given,
        )
        result = job.run_audit(
            spark,
            read_parquet(spark, tmp_path / "store"),
            options,
            progress=lambda _message: seen.append(spark.conf.get(SHUFFLE)),
        )
        after = spark.conf.get(SHUFFLE)
    finally:
        spark.conf.set(SHUFFLE, before)
    assert spark.sparkContext.defaultParallelism == 2  # the test session's local[2]
    assert result.summary["totals"]["cms"] == spec.cms
    assert seen and set(seen) == {expected}
    assert after == "7"
