"""The audit job: inputs -> the shared frames -> tables, ``summary.json``, ``report.html``.

Reading happens before (:mod:`spark_audit.readers`, :mod:`spark_audit.jdbc`) and writing
only here, at the edge. The work is a fixed, small number of Spark jobs:

1. the distinct conditions and their plans, and the senders
   (:func:`spark_audit.transforms.conditions.plan_set`);
2. every CM, cut at the window and partitioned by ``cm_key`` (a 64-bit hash of
   ``cm_id``, see :func:`spark_audit.transforms.enrich.cm_key`; cached): the CMs' one
   shuffle;
3. every ack in the cut with its CM (cached, numbers for its text: no ids), and one pass
   of counts per receiver: the acks' one shuffle; every later join and grouping by CM
   runs on this partitioning and moves nothing;
4. the latency histogram (percentiles, distributions, relay lag per receiver);
5. every CM judged, with one aggregation for the outcome tables, the per-destination
   table, the totals and the rows of the CMs a per-CM detail table lists (by the CM's
   numbers; one lookup gives their ids);
6. the acks of the ack-level detail tables: read again for the few CMs they belong to
   (found by ``cm_key`` in the cached acks) and, when they are few, collected once
   (beside them, in a second thread, the discrepancies' stored reasons), then one query
   over those rows that collects every such table small enough for the driver.

Small tables are collected and written from the driver with pyarrow; a detail table with
more than :data:`DRIVER_ROWS` rows is written by Spark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import reduce
from pathlib import Path
from typing import Any, TypeVar
from uuid import uuid4

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.util import inheritable_thread_target

from spark_audit.checks import DEFAULT_CHECKS, CheckSpec, run_checks, status
from spark_audit.readers import AuditInput, Window, seen_in, sent_in
from spark_audit.reevaluate.fallback import judge_rows, python_verdicts
from spark_audit.reevaluate.recompute import judge_cut
from spark_audit.report import write_report
from spark_audit.schemas import local_frame
from spark_audit.summary import build_summary, metrics_from
from spark_audit.transforms import anomalies, enrich, rates
from spark_audit.transforms.conditions import PlanSet, plan_set
from spark_audit.transforms.enrich import (
    cm_ranks,
    cut_cms,
    enrich_acks,
    pack_flags,
    unpack_flags,
)
from spark_audit.transforms.latency import Histograms, histogram_frame
from spark_audit.transforms.skew import receiver_rows

#: A detail table with at most this many rows is collected and written by the driver.
DRIVER_ROWS = 200_000
#: CMs per partition of the shared frames, at most (see ``partitions_for``).
CMS_PER_PARTITION = 320_000
#: File splits per partition the audit's inputs are sized for (``audit_settings``).
READ_SPLITS = 4
_MIN_SPLITS = "spark.sql.files.minPartitionNum"
#: At most this many discrepancies are explained with ``evaluate`` on the driver.
DRIVER_EXPLAIN = 10_000
#: Detail tables whose first rows the report shows.
SAMPLED_TABLES = ("discrepancies", "late_ack_effects", "status_mismatches", "stale_pending")
SAMPLE_ROWS = 50
UTC = "UTC"
#: The column naming each row's table in :meth:`_Output.frames`' one query.
_TABLE = "_table"
_T = TypeVar("_T")
#: How often :func:`_beside` cancels its thread's jobs again while it waits for the thread.
_CANCEL_EVERY_S = 0.2
_FLAGGED = T.StructType(
    [
        T.StructField("cm_id", T.StringType()),
        *(T.StructField(name, T.BooleanType()) for name in ("discrepant", "multi", "late")),
    ]
)
_IDS = T.StructType([T.StructField("cm_id", T.StringType())])
_KEYS = T.StructType(
    [T.StructField("cm_key", T.LongType()), T.StructField("cm_rank", T.IntegerType())]
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditOptions:
    out: Path
    window: Window
    source: str
    checks: tuple[CheckSpec, ...] = DEFAULT_CHECKS
    stale_grace: timedelta = timedelta(minutes=1)
    bucket_seconds: int | None = None
    #: At least this many partitions for the shared frames and the audit's shuffles
    #: (default: one per core Spark runs tasks on); more for many CMs (``partitions_for``).
    partitions: int | None = None

    def __post_init__(self) -> None:
        if self.partitions is not None and self.partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {self.partitions}")


@dataclass(slots=True)
class AuditResult:
    status: str
    summary: dict[str, Any]
    out: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "fail" else 0


class _Clock:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.start = time.perf_counter()
        self.last = self.start
        self.say = say
        self.timings: dict[str, float] = {}

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.last, 3)
        self.last = now
        self.say(f"[audit {now - self.start:7.1f}s] {name}")


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


class _Output:
    """Writes the tables under ``tables/`` and keeps their row counts and samples."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.counts: dict[str, int] = {}
        self.collected: dict[str, list[dict[str, Any]]] = {}

    def rows(self, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
        self.arrow(name, pa.Table.from_pylist(rows, schema=schema), keep_all=True)

    def arrow(self, name: str, table: pa.Table, *, keep_all: bool = False) -> None:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path / "part-00000.parquet")
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
        with _small(union.sparkSession):
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
        else:
            path = self.root / name
            frame.write.mode("overwrite").parquet(str(path))
            written = frame.sparkSession.read.parquet(str(path))
            self.counts[name] = written.count()
            if name in SAMPLED_TABLES and self.counts[name]:
                rows = written.limit(SAMPLE_ROWS).collect()
                self.collected[name] = [r.asDict(recursive=True) for r in rows]


@contextmanager
def audit_settings(spark: SparkSession, partitions: int) -> Iterator[None]:
    """Session settings for the audit's run, restored afterwards.

    * cached frames are stored uncompressed: building the compressed column batches
      costs more than the audit saves by scanning them (each is read a few times);
    * adaptive execution is off: the audit's plans are fixed (its joins are broadcast or
      on the CMs' partitioning by design), and adaptive execution would run every
      shuffle and every cache as a job of its own and plan each query again after it
      (about a third more jobs, and a cache written in one pass and read back in the
      next where a plain plan fills it while the first query runs);
    * so nothing merges small shuffle partitions: the audit's shuffles get ``partitions``
      (``partitions_for``; :func:`_run` raises it once it knows the number of CMs), except
      the few small queries, which run on one (:func:`_small`). With Spark's default of
      200, every stage after a shuffle ran 200 tiny tasks: on two cores a warm 20 000-ack
      audit took 22.3-23.5 s, against 3.6-4.0 s with two partitions;
    * files are read in splits sized for :data:`READ_SPLITS` per partition the run
      starts with, ``partitions`` (``spark.sql.files.minPartitionNum``, unless the
      session sets it; a split never gets smaller than a Parquet row group or
      ``spark.sql.files.openCostInBytes``): with Spark's default (one per core) a file
      source is read in splits of up to 128 MB, so the 304 MB of CMs at 10M acks were
      three tasks on two cores, the last one alone (eight now:
      the best of five alternating runs 35.9 -> 34.9 s, the median 36.4 -> 36.0 s).
    """
    settings = {
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": str(partitions),
    }
    if spark.conf.get(_MIN_SPLITS, None) is None:
        settings[_MIN_SPLITS] = str(READ_SPLITS * partitions)
    with _settings(spark, settings):
        yield


@contextmanager
def _settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
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


def _small(spark: SparkSession) -> AbstractContextManager[None]:
    """For a query whose shuffles carry a few rows (at most :data:`DRIVER_ROWS`, or a few
    per task after a partial aggregation): its shuffles to one partition (one task per
    stage instead of ``spark.sql.shuffle.partitions``)."""
    return _settings(spark, {"spark.sql.shuffle.partitions": "1"})


@contextmanager
def _beside(spark: SparkSession, work: Callable[[], _T]) -> Iterator[Future[_T]]:
    """``work`` run in a second driver thread while the block runs (its result: the
    future). The thread inherits the caller's Spark local properties and tags; its jobs
    carry a tag of their own, so that if the block fails they are cancelled rather than
    waited for, including one the thread submits after the failure (Spark cancels only
    the jobs already submitted: the tag is cancelled again until the thread is done)."""
    context = spark.sparkContext
    tag = f"condmsg-audit-{uuid4().hex}"

    def tagged() -> _T:
        context.addJobTag(tag)
        try:
            return work()
        finally:
            context.removeJobTag(tag)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="condmsg-audit") as pool:
        future = pool.submit(inheritable_thread_target(spark)(tagged))
        try:
            yield future
        except BaseException:
            while not future.done():
                context.cancelJobsWithTag(tag)
                wait([future], timeout=_CANCEL_EVERY_S)
            raise


def run_audit(
    spark: SparkSession,
    data: AuditInput,
    options: AuditOptions,
    progress: Callable[[str], None] = print,
) -> AuditResult:
    """Run the whole audit and write its outputs under ``options.out``.

    ``data`` is the source as read (``read_parquet``, ``read_jdbc``) or already cut
    (``apply_window``): the audit cuts it at ``options.window`` itself.
    """
    least = options.partitions or least_partitions(spark)
    with audit_settings(spark, least):
        return _run(spark, data, options, _Clock(progress), least)


def _run(
    spark: SparkSession, data: AuditInput, options: AuditOptions, clock: _Clock, least: int
) -> AuditResult:
    window = options.window
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    output = _Output(out / "tables")
    cached: list[DataFrame] = []

    def keep(frame: DataFrame) -> DataFrame:
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return frame

    # One scan of the CMs: their distinct conditions and senders, and the count and span
    # of those in the window.
    plans = plan_set(data.cms, chosen=sent_in(window), senders=True)
    cut = plans.chosen
    assert cut is not None
    clock.step("decoded the conditions")
    partitions = partitions_for(int(cut["cms"]), least)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))  # audit_settings restores it

    def frames(ranks: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:
        """The cached CMs and acks. The acks' text columns only where ``evaluate`` judges
        some CMs over them; else the detail tables read the text of their few acks again
        (_ack_rows)."""
        cut_frame = keep(cut_cms(data.cms, plans, window, partitions, ranks))
        text = plans.python
        enriched = enrich_acks(data.acks, data.compensations, cut_frame, plans, window, text=text)
        # The acks are cached with their flags packed into one int (pack_flags).
        return cut_frame, unpack_flags(keep(pack_flags(enriched)))

    cms, acks = frames()
    bucket = _bucket(options, cut)
    # The per-CM job and the histogram's both read the two caches and need nothing from
    # each other: the per-CM one is planned and submitted from a second thread, so its
    # planning and the driver's work on the histogram overlap the running jobs, and its
    # tasks take the cores the histogram's last tasks leave idle (each cached partition is
    # built once: a task that reaches one being built waits for it).
    with _beside(spark, lambda: _judged(plans, cms, acks, options, bucket)) as judging:
        histograms = Histograms(histogram_frame(acks).toArrow(), plans.destinations)
        ack_counts = histograms.totals()
        output.rows("latency", histograms.latency_rows(), SMALL_SCHEMAS["latency"])
        output.rows(
            "latency_histogram", histograms.histogram_rows(), SMALL_SCHEMAS["latency_histogram"]
        )
        receivers = receiver_rows(histograms.receiver_metrics(), histograms.relay_by_receiver())
        output.rows("receivers", receivers, SMALL_SCHEMAS["receivers"])
        clock.step("read the cut; latencies and clocks")
        folded = judging.result()
    if folded["collided"]:
        # Two CMs share a ``cm_key``: number them apart and build the CM frames again.
        ranks = cm_ranks(cms)
        for frame in cached:
            frame.unpersist()
        cached.clear()
        cms, acks = frames(ranks)
        folded = _judged(plans, cms, acks, options, bucket)
    candidates = _with_ids(cms, folded["candidates"])
    for name in ("rates_by_sender", "rates_by_shape", "outcomes_over_time", "destinations"):
        output.rows(name, folded[name], SMALL_SCHEMAS[name])
    clock.step("re-evaluated and rated the CMs")

    overall = {key: int(value) for key, value in folded["overall"].items()}
    late_metrics = _details(
        spark, data, options, _Shared(plans, cms, acks), candidates, overall, ack_counts, output
    )
    clock.step("wrote the detail tables")
    for frame in cached:
        frame.unpersist()

    totals = {
        "cms": int(cut["cms"]),
        "decided": overall.get("decided", 0),
        "pending": overall.get("pending", 0),
        "native_cms": overall.get("native_cms", 0),
        "shapes": len(folded["rates_by_shape"]),
        "acks": ack_counts["facts"] + ack_counts["other_rows"],
    }
    counts = dict(output.counts)
    for problem in anomalies.PROBLEMS:
        counts[f"status:{problem}"] = ack_counts[problem]
    for metric, value in late_metrics.items():
        counts[f"metric:{metric}"] = value
    metrics = metrics_from(totals, counts, output.collected)
    results = run_checks(metrics, options.checks)
    verdict = status(results)
    summary = build_summary(
        status=verdict,
        window=window,
        source=options.source,
        spark=spark,
        totals=totals,
        metrics=metrics,
        checks=results,
        counts=counts,
        collected=output.collected,
        timings=clock.timings,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    write_report(out / "report.html", summary, output.collected)
    clock.step(f"wrote summary.json and report.html: {verdict}")
    summary["timings_s"] = clock.timings
    return AuditResult(verdict, summary, out, clock.timings)


def _judged(
    plans: PlanSet, cms: DataFrame, acks: DataFrame, options: AuditOptions, bucket: int
) -> dict[str, Any]:
    """Every CM judged and rolled up (:func:`spark_audit.transforms.rates.fold`)."""
    judged = judge_cut(
        cms, acks, plans, until=options.window.until, stale_grace=options.stale_grace
    )
    rolled = rates.rollup_frame(judged, plans, bucket).toArrow().to_pylist()
    return rates.fold(rolled, plans.senders)


def _with_ids(cms: DataFrame, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``candidates`` (CMs by ``cm_key, cm_rank``) with their ``cm_id``, ordered by it:
    one lookup in the cached CMs (a broadcast join on the numbers)."""
    if not candidates:
        return []
    keys = local_frame(
        cms.sparkSession,
        [{"cm_key": c["cm_key"], "cm_rank": c["cm_rank"]} for c in candidates],
        _KEYS,
    )
    found = (
        cms.where("in_window")
        .join(F.broadcast(keys), ["cm_key", "cm_rank"], "left_semi")
        .select("cm_key", "cm_rank", "cm_id")
        .toArrow()
        .to_pylist()
    )
    ids = {(r["cm_key"], r["cm_rank"]): r["cm_id"] for r in found}
    named = [{**c, "cm_id": ids.get((c["cm_key"], c["cm_rank"]))} for c in candidates]
    return sorted(named, key=lambda c: str(c["cm_id"]))


@dataclass(frozen=True, slots=True)
class _Shared:
    """The plans and the cached frames (:func:`cut_cms`, :func:`enrich_acks`)."""

    plans: PlanSet
    cms: DataFrame
    acks: DataFrame


def _ack_rows(
    data: AuditInput, window: Window, shared: _Shared, flagged: DataFrame, *, small: bool
) -> DataFrame:
    """:func:`spark_audit.transforms.anomalies.ack_candidates`: from the cached acks if
    they carry their text, else from the acks read again for the few CMs whose acks the
    tables need (those of the flagged CMs and of every listed ack, found by ``cm_key``
    in the cached acks), enriched as the cached ones were: the same rows, each with its
    text. ``small``: few enough listed acks to broadcast their keys."""
    if "ack_id" in shared.acks.columns:
        return anomalies.ack_candidates(shared.acks, flagged)
    keys = (
        anomalies.listed_keys(shared.acks)
        .unionByName(flagged.select(enrich.cm_key()))
        .select(F.col("cm_key").alias("_key"))
    )
    if small:
        keys = F.broadcast(keys)
    on = F.col("cm_key") == F.col("_key")
    source = data.acks.select("*", enrich.cm_key()).join(keys, on, "left_semi").drop("cm_key")
    cms = shared.cms.join(keys, on, "left_semi")
    none = data.compensations.where(F.lit(False))
    text = enrich_acks(source, none, cms, shared.plans, window, text=True)
    return anomalies.ack_candidates(text, flagged)


def partitions_for(cms: int, least: int) -> int:
    """The audit's partitions, of the shared frames and of its shuffles: ``least`` (the
    options' or :func:`least_partitions`), or more where the CMs would give a partition
    more than :data:`CMS_PER_PARTITION` on average (the per-CM hash tables of a task, the
    join's and the aggregation's, then stay small).

    On two cores: 0.97 M acks ran in 6.8-7.0 s on 2 partitions against 7.3-7.7 s on 8;
    9.7 M acks in 40.5-40.6 s on 16 (the CMs' rule), 41.0-41.1 s on 8 and 42.5-46.2 s
    on 4."""
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


def _bucket(options: AuditOptions, cut: Any) -> int:
    """The ``outcomes_over_time`` bucket: given, or about 48 over the CMs' time span."""
    if options.bucket_seconds is not None:
        return options.bucket_seconds
    first, last = cut["first"], cut["last"]
    if options.window.since is not None:
        first = options.window.since.replace(tzinfo=None)
    span = (last - first).total_seconds() if first is not None and last is not None else 0.0
    return rates.bucket_seconds_for(span)


def _acks_by_cm(frame: DataFrame) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for ack in frame.toArrow().to_pylist():
        found.setdefault(ack["cm_id"], []).append(ack)
    return found


def _judged_with_acks(
    cases: list[dict[str, Any]], acks: DataFrame, *, counted: dict[str, int] | None = None
) -> dict[str, dict[str, Any]]:
    """:func:`spark_audit.reevaluate.fallback.judge_row` of each case (``cm_id,
    condition_json, sent_at, at``) over its ``acks``: on the driver when they are few,
    else on the executors. ``counted``: filled with each CM's number of counted acks."""
    if len(cases) <= DRIVER_EXPLAIN:
        by_cm = _acks_by_cm(acks)
        if counted is not None:
            counted.update(
                {cm: sum(bool(a["counted"]) for a in found) for cm, found in by_cm.items()}
            )
        rows = judge_rows({**c, "acks": by_cm.get(c["cm_id"], [])} for c in cases)
    else:
        if counted is not None:
            found = acks.where("counted").groupBy("cm_id").count().collect()
            counted.update({r["cm_id"]: int(r["count"]) for r in found})
        frame = acks.sparkSession.createDataFrame(
            [(c["cm_id"], c["condition_json"], c["sent_at"], c["at"]) for c in cases],
            "cm_id string, condition_json string, sent_at timestamp, at timestamp",
        )
        rows = python_verdicts(frame, acks).toArrow().to_pylist()
    return {row["cm_id"]: row for row in rows}


def _details(
    spark: SparkSession,
    data: AuditInput,
    options: AuditOptions,
    shared: _Shared,
    candidates: list[dict[str, Any]],
    overall: Mapping[str, int],
    ack_counts: Mapping[str, int],
    output: _Output,
) -> dict[str, int]:
    """Every detail table: the per-CM ones from the candidate CMs (on the driver), the
    ack-level ones from the candidate acks (see :mod:`spark_audit.transforms.anomalies`).
    Returns the late-ack metrics (judged here: see ``verdict_with_late`` in
    :func:`spark_audit.transforms.enrich.judge`)."""
    stale = [c for c in candidates if c["stale"]]
    output.rows("stale_pending", stale, CM_SCHEMAS["stale_pending"])
    invalid = [c for c in candidates if not c["valid"]]
    output.rows("invalid_conditions", invalid, CM_SCHEMAS["invalid_conditions"])
    wrong = [c for c in candidates if c["decided"] and not c["agrees"]]
    late = [c for c in candidates if c["decided"] and c["late_acks"]]
    wrong_ids, late_ids = {c["cm_id"] for c in wrong}, {c["cm_id"] for c in late}
    flags = [
        {
            "cm_id": c["cm_id"],
            "discrepant": c["cm_id"] in wrong_ids,
            "multi": c["multi"] > 0,
            "late": c["cm_id"] in late_ids,
        }
        for c in candidates
        if c["cm_id"] in wrong_ids or c["multi"] > 0 or c["cm_id"] in late_ids
    ]
    flagged, flagged_cms = local_frame(spark, flags, _FLAGGED), len(flags)
    expected = sum(
        ack_counts[k] for k in ("late_acks", "malformed_acks", "orphan_rows", *anomalies.PROBLEMS)
    )
    small = expected <= DRIVER_ROWS
    # The candidate acks (the listed ones and those of the flagged CMs): collected when
    # few (DRIVER_ROWS listed ones, the acks of at most DRIVER_EXPLAIN flagged CMs);
    # cached when only the listed ones are few; else read again by each query.
    cached: DataFrame | None = None
    try:
        # The stored reasons of the discrepancies are read from the source in a second
        # thread: a scan of the CMs whose few tasks fill the cores the acks' scan leaves.
        with _beside(spark, lambda: _stored_reasons(data, wrong)) as reading:
            rows = _ack_rows(data, options.window, shared, flagged, small=small)
            if small and flagged_cms <= DRIVER_EXPLAIN:
                rows = _collected(rows)
            elif small:
                rows = cached = rows.persist(StorageLevel.MEMORY_AND_DISK)
            late_metrics = _late_effects(late, rows, output)
            anomaly_frame = data.anomalies.where(seen_in(options.window, "recorded_at"))
            with _small(spark):  # the reasons' query has no shuffle for this to change
                kinds = dict(anomalies.anomaly_counts(anomaly_frame))
            reasons = reading.result()
        output.rows(
            "anomaly_counts",
            [{"kind": k, "count": v} for k, v in sorted(kinds.items())],
            SMALL_SCHEMAS["anomaly_counts"],
        )
        _discrepancies(wrong, reasons, rows, output)
        orphans = ack_counts["orphan_rows"] + kinds.get("unknown_cm", 0)
        mismatches = sum(ack_counts[p] for p in anomalies.PROBLEMS)
        output.frames(
            {
                "late_acks": (anomalies.late_acks(rows), ack_counts["late_acks"]),
                "orphan_acks": (anomalies.orphan_acks(rows, anomaly_frame), orphans),
                "duplicate_acks": (
                    anomalies.duplicate_acks(anomaly_frame),
                    kinds.get("duplicate", 0),
                ),
                "multiple_consumptions": (
                    anomalies.multiple_consumptions(rows),
                    overall.get("multiple_consumptions", 0),
                ),
                "status_mismatches": (anomalies.status_mismatches(rows), mismatches),
                "malformed_acks": (anomalies.malformed_acks(rows), ack_counts["malformed_acks"]),
            }
        )
    finally:
        if cached is not None:
            cached.unpersist()
    return late_metrics


def _collected(frame: DataFrame) -> DataFrame:
    """``frame`` computed once and held by the driver, as a frame of its rows.

    For the candidate acks (few: see :func:`_details`): every detail table is then a
    query of driver-side rows, planned without the cached frames' lineage (about a
    second of planning at 1M acks) and run without touching the caches."""
    return frame.sparkSession.createDataFrame(frame.toArrow(), frame.schema)


def _late_effects(late: list[dict[str, Any]], rows: DataFrame, output: _Output) -> dict[str, int]:
    """The ``late_ack_effects`` table: each decided CM with late acks judged again with
    every ack (where the compiled path judged it; ``evaluate`` already did for the rest)."""
    missing = [{**c, "at": c["effective_at"]} for c in late if c["verdict_with_late"] is None]
    if missing:
        judged = _judged_with_acks(missing, anomalies.flagged_acks(rows, "late"))
        for case in late:
            if case["verdict_with_late"] is None and case["cm_id"] in judged:
                case["verdict_with_late"] = judged[case["cm_id"]]["py_verdict_all"]
    effects = []
    for c in late:
        changes = (
            c["verdict_with_late"] is not None and c["verdict_with_late"] != c["recomputed_verdict"]
        )
        effects.append(
            {
                **c,
                "stored_verdict": c["state"],
                "verdict_counted": c["recomputed_verdict"],
                "changes_verdict": changes,
            }
        )
    output.rows("late_ack_effects", effects, CM_SCHEMAS["late_ack_effects"])
    return {
        "late_acks_changing_verdict": sum(e["changes_verdict"] for e in effects),
        "late_ack_flag_mismatches": sum(e["changes_verdict"] != e["flagged"] for e in effects),
    }


def _stored_reasons(data: AuditInput, wrong: list[dict[str, Any]]) -> dict[str, str | None]:
    """``reasons_json`` of the ``wrong`` CMs, as the source stores it (by ``cm_id``)."""
    if not wrong:
        return {}
    ids = local_frame(data.cms.sparkSession, [{"cm_id": c["cm_id"]} for c in wrong], _IDS)
    stored = data.cms.join(F.broadcast(ids), "cm_id", "left_semi").select("cm_id", "reasons_json")
    return {r["cm_id"]: r["reasons_json"] for r in stored.toArrow().to_pylist()}


def _discrepancies(
    wrong: list[dict[str, Any]],
    reasons: Mapping[str, str | None],
    rows: DataFrame,
    output: _Output,
) -> None:
    """The disagreeing CMs with evidence: ``evaluate``'s verdict and reasons over their
    counted acks, and the evaluator's stored reasons (``reasons``: by ``cm_id``)."""
    if not wrong:
        output.arrow("discrepancies", DISCREPANCY_SCHEMA.empty_table())
        return
    evidence = anomalies.flagged_acks(rows, "discrepant").where("counted")
    cases = [{**c, "at": c["effective_at"]} for c in wrong]
    counted: dict[str, int] = {}
    explained = _judged_with_acks(cases, evidence, counted=counted)
    table = []
    for case in cases:
        found = explained.get(case["cm_id"], {})
        table.append(
            {
                **case,
                "stored_verdict": case["state"],
                "python_verdict": found.get("py_verdict"),
                "counted_acks": counted.get(case["cm_id"], 0),
                "reasons": found.get("py_reasons") or [],
                "stored_reasons_json": reasons.get(case["cm_id"]),
                "error": case["error"] or found.get("py_error"),
            }
        )
    output.arrow("discrepancies", pa.Table.from_pylist(table, schema=DISCREPANCY_SCHEMA))
