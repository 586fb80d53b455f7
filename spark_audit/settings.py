"""Session settings and partitions of an audit run.

The audit sizes its partitions once (:func:`least_partitions`, then
:func:`partitions_for` when it knows the number of CMs) and runs with the session
settings of :func:`audit_settings`, which are restored afterwards. A setting the user
gave when the application started (``--conf`` of ``spark-submit`` or ``condmsg audit``,
``spark-defaults.conf``, the session builder: :func:`launch_setting`) is never changed:
the audit's choice applies only where the user made none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from pyspark.sql import SparkSession

#: CMs per partition of the shared frames, at most (see ``partitions_for``).
CMS_PER_PARTITION = 320_000
#: File splits per partition the audit's inputs are sized for (``audit_settings``).
READ_SPLITS = 4
_MIN_SPLITS = "spark.sql.files.minPartitionNum"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
ADAPTIVE = "spark.sql.adaptive.enabled"
TIME_ZONE = "spark.sql.session.timeZone"
DYNAMIC_ALLOCATION = "spark.dynamicAllocation.enabled"
#: How long the audit waits for a cluster's first executor before it counts their cores.
EXECUTOR_WAIT_S = 30.0


def launch_setting(spark: SparkSession, key: str) -> str | None:
    """``key`` as the application was started with it (``--conf``, spark-defaults, the
    session builder), or None where the user left it to Spark's default."""
    conf = spark.sparkContext.getConf()
    return conf.get(key) if conf.contains(key) else None


def _dynamic(spark: SparkSession) -> bool:
    return (launch_setting(spark, DYNAMIC_ALLOCATION) or "false").lower() == "true"


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
      (see bench/RESULTS.md);
    * files are read in splits sized for :data:`READ_SPLITS` per partition the run
      starts with, ``partitions`` (``spark.sql.files.minPartitionNum``, unless the
      session sets it; a split never gets smaller than a Parquet row group or
      ``spark.sql.files.openCostInBytes``): with Spark's default (one per core) a file
      source is read in splits of up to 128 MB, so a few large files would be fewer
      tasks than cores, the last one running alone.

    Each only where the user set none at launch (:func:`launch_setting`). With dynamic
    allocation, adaptive execution stays on: executors come only as tasks wait, so the
    cores the audit could size its partitions for are not known when it starts, and
    adaptive execution merges the small partitions of a shuffle sized for more.
    """
    wanted = {
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        SHUFFLE_PARTITIONS: str(partitions),
    }
    if not _dynamic(spark):
        wanted[ADAPTIVE] = "false"
    settings = {k: v for k, v in wanted.items() if launch_setting(spark, k) is None}
    # Every instant is a UTC one: rendered, bucketed and collected as UTC whatever the
    # user's session uses (restored afterwards).
    settings[TIME_ZONE] = "UTC"
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


def partitions_for(spark: SparkSession, cms: int, least: int) -> int:
    """The audit's partitions, of the shared frames and of its shuffles: ``least`` (the
    options' or :func:`least_partitions`), or more where the CMs would give a partition
    more than :data:`CMS_PER_PARTITION` on average (the per-CM hash tables of a task, the
    join's and the aggregation's, then stay small; bench/RESULTS.md has the
    measurements behind the bound). The user's ``spark.sql.shuffle.partitions`` (at
    launch) is taken as it is."""
    if launch_setting(spark, SHUFFLE_PARTITIONS) is not None:
        return least
    return partitions_for_cms(cms, least)


def partitions_for_cms(cms: int, least: int) -> int:
    """``least``, or one partition per :data:`CMS_PER_PARTITION` CMs where that is more."""
    return max(least, -(-cms // CMS_PER_PARTITION))


def least_partitions(spark: SparkSession) -> int:
    """The audit's partitions before it counts the CMs, where the options give none: the
    user's ``spark.sql.shuffle.partitions`` if set at launch; else one per core Spark runs
    tasks on (``defaultParallelism``: in local mode the threads; on a cluster the
    executors' cores, or ``spark.default.parallelism`` where set). On a cluster the
    executors register after the application starts: the audit waits up to
    :data:`EXECUTOR_WAIT_S` for the first one, else Spark would count none (and fall back
    to 2). With dynamic allocation, the session's ``spark.sql.shuffle.partitions`` (see
    :func:`audit_settings`)."""
    given = launch_setting(spark, SHUFFLE_PARTITIONS)
    if given is not None:
        return int(given)
    context = spark.sparkContext
    if _dynamic(spark):
        return int(spark.conf.get(SHUFFLE_PARTITIONS) or context.defaultParallelism)
    if not (context.master or "").startswith("local"):
        _wait_for_an_executor(spark)
    return context.defaultParallelism


def _wait_for_an_executor(spark: SparkSession) -> None:
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + EXECUTOR_WAIT_S
    # The driver is listed too: an executor makes two.
    while len(tracker.getExecutorInfos()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
