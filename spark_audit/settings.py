"""Session settings and partitions of an audit run.

The audit sizes its partitions once (:func:`least_partitions`, then
:func:`partitions_for` when it knows the number of CMs) and runs with the session
settings of :func:`audit_settings`, which are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from pyspark.sql import SparkSession

#: CMs per partition of the shared frames, at most (see ``partitions_for``).
CMS_PER_PARTITION = 320_000
#: File splits per partition the audit's inputs are sized for (``audit_settings``).
READ_SPLITS = 4
_MIN_SPLITS = "spark.sql.files.minPartitionNum"


@contextmanager
def audit_settings(spark: SparkSession, partitions: int) -> Iterator[None]:
    """Session settings for the audit's run, restored afterwards.

    * cached frames are stored uncompressed: building the compressed column batches
      costs more than the audit saves by scanning them (each is read a few times);
    * adaptive execution is off: the audit's plans are fixed (its joins are broadcast or
      on the CMs' partitioning by design), and adaptive execution would run every
      shuffle and every cache as a job of its own and plan each query again after it
      (more jobs, and a cache written in one pass and read back in the next where a
      plain plan fills it while the first query runs);
    * so nothing merges small shuffle partitions: the audit's shuffles get ``partitions``
      (``partitions_for``; the run raises it once it knows the number of CMs), except
      the few small queries, which run on one (:func:`one_shuffle_partition`). With
      Spark's default of 200, every stage after a shuffle would run 200 tiny tasks
      (see docs/audit-performance.md);
    * files are read in splits sized for :data:`READ_SPLITS` per partition the run
      starts with, ``partitions`` (``spark.sql.files.minPartitionNum``, unless the
      session sets it; a split never gets smaller than a Parquet row group or
      ``spark.sql.files.openCostInBytes``): with Spark's default (one per core) a file
      source is read in splits of up to 128 MB, so a few large files would be fewer
      tasks than cores, the last one running alone.
    """
    settings = {
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": str(partitions),
    }
    if spark.conf.get(_MIN_SPLITS, None) is None:
        settings[_MIN_SPLITS] = str(READ_SPLITS * partitions)
    with session_settings(spark, settings):
        yield


@contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` on the session while the block runs, restored afterwards (also when
    setting one of them fails)."""
    previous: dict[str, str | None] = {key: spark.conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, before in previous.items():
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)


def one_shuffle_partition(spark: SparkSession) -> AbstractContextManager[None]:
    """For a query whose shuffles carry a few rows (at most
    :data:`spark_audit.output.DRIVER_ROWS`, or a few per task after a partial
    aggregation): its shuffles to one partition (one task per stage instead of
    ``spark.sql.shuffle.partitions``)."""
    return session_settings(spark, {"spark.sql.shuffle.partitions": "1"})


def partitions_for(cms: int, least: int) -> int:
    """The audit's partitions, of the shared frames and of its shuffles: ``least`` (the
    options' or :func:`least_partitions`), or more where the CMs would give a partition
    more than :data:`CMS_PER_PARTITION` on average (the per-CM hash tables of a task, the
    join's and the aggregation's, then stay small; docs/audit-performance.md has the
    measurements behind the bound)."""
    return max(least, -(-cms // CMS_PER_PARTITION))


def least_partitions(spark: SparkSession) -> int:
    """The audit's partitions before it counts the CMs, where the options give none: one
    per core Spark runs tasks on (``defaultParallelism``) in local mode, or wherever
    ``spark.default.parallelism`` is set. On a cluster without it, executors may still
    be starting (or, with dynamic allocation, come only as tasks wait), and Spark counts
    the cores registered so far: there the session's ``spark.sql.shuffle.partitions``
    stands, as for any Spark job."""
    context = spark.sparkContext
    if (context.master or "").startswith("local") or context.getConf().contains(
        "spark.default.parallelism"
    ):
        return context.defaultParallelism
    return int(spark.conf.get("spark.sql.shuffle.partitions") or context.defaultParallelism)
