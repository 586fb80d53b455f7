"""The audit job: inputs -> the shared frames -> tables, ``summary.json``, ``report.html``.

Reading happens before (:mod:`spark_audit.readers`, :mod:`spark_audit.jdbc`) and writing
only at the edge (:mod:`spark_audit.output`). The work is a fixed, small number of Spark
jobs:

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
6. the detail tables (:mod:`spark_audit.details`);
7. the Dependency-Spheres re-judged from their members (:mod:`spark_audit.sphere_audit`).

The run's session settings and partitions are those of :mod:`spark_audit.settings`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_audit import storage
from spark_audit.alongside import run_alongside
from spark_audit.checks import DEFAULT_CHECKS, CheckSpec, run_checks, status
from spark_audit.details import AuditFrames, write_detail_tables
from spark_audit.output import SMALL_SCHEMAS, TableWriter
from spark_audit.readers import AuditInput, Window, sent_in
from spark_audit.reevaluate.recompute import judge_cut
from spark_audit.report import render
from spark_audit.schemas import local_frame
from spark_audit.settings import (
    SHUFFLE_PARTITIONS,
    audit_settings,
    launch_setting,
    least_partitions,
    partitions_for,
)
from spark_audit.sphere_audit import write_sphere_tables
from spark_audit.storage import child
from spark_audit.summary import build_summary, metrics_from
from spark_audit.transforms import anomalies, rates
from spark_audit.transforms.ack_flags import pack_flags, unpack_flags
from spark_audit.transforms.conditions import PlanSet, plan_set
from spark_audit.transforms.enrich import cm_ranks, cut_cms, enrich_acks
from spark_audit.transforms.latency import Histograms, histogram_frame
from spark_audit.transforms.skew import receiver_rows

_KEYS = T.StructType(
    [T.StructField("cm_key", T.LongType()), T.StructField("cm_rank", T.IntegerType())]
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditOptions:
    #: Where the tables, ``summary.json`` and ``report.html`` go: a path or any Hadoop
    #: URI (``file://``, ``hdfs://``, ``s3a://``). None: nothing is written (the tables
    #: are in :attr:`AuditResult.tables`).
    out: str | Path | None
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
    out: str | None
    timings: dict[str, float] = field(default_factory=dict)
    #: Every table of the audit as a frame (those written: read from where they were).
    tables: Mapping[str, DataFrame] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "fail" else 0


#: The Spark job group of every job an audit runs (Spark's UI lists them under it).
JOB_GROUP = "condmsg-audit"


class _Clock:
    """The run's steps: timed, reported through ``say`` and named in Spark's UI (each
    step's jobs carry its description; a second driver thread started within a step
    inherits it, see :func:`spark_audit.alongside.run_alongside`)."""

    def __init__(self, spark: SparkSession, say: Callable[[str], None]) -> None:
        self.context = spark.sparkContext
        self.start = time.perf_counter()
        self.last = self.start
        self.say = say
        self.timings: dict[str, float] = {}

    def next(self, description: str) -> None:
        """The jobs from here on are this step's (Spark UI: ``description``)."""
        self.context.setJobGroup(JOB_GROUP, f"condmsg audit: {description}")

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.last, 3)
        self.last = now
        self.say(f"[audit {now - self.start:7.1f}s] {name}")

    def done(self) -> None:
        self.context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]


class _CachedFrames:
    """The shared frames of one run, cached: the CMs (:func:`cut_cms`) and the acks
    (:func:`enrich_acks`), built again when two CMs share a ``cm_key``."""

    def __init__(self, data: AuditInput, plans: PlanSet, window: Window, partitions: int) -> None:
        self.data = data
        self.plans = plans
        self.window = window
        self.partitions = partitions
        self.kept: list[DataFrame] = []

    def build(self, ranks: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:
        """The cached CMs and acks. The acks' text columns only where ``evaluate`` judges
        some CMs over them; else the detail tables read the text of their few acks again
        (:func:`spark_audit.details.candidate_acks`)."""
        data = self.data
        cut_frame = self._keep(cut_cms(data.cms, self.plans, self.window, self.partitions, ranks))
        text = self.plans.python
        enriched = enrich_acks(
            data.acks, data.compensations, cut_frame, self.plans, self.window, text=text
        )
        # The acks are cached with their flags packed into one int (pack_flags).
        return cut_frame, unpack_flags(self._keep(pack_flags(enriched)))

    def release(self) -> None:
        for frame in self.kept:
            frame.unpersist()
        self.kept.clear()

    def _keep(self, frame: DataFrame) -> DataFrame:
        self.kept.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return frame


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
    clock = _Clock(spark, progress)
    out = None if options.out is None else str(options.out)
    writer = TableWriter(spark, None if out is None else child(out, "tables"))
    try:
        with audit_settings(spark, least):
            return _run(spark, data, options, clock, writer, least)
    finally:
        writer.close()
        clock.done()


def _run(
    spark: SparkSession,
    data: AuditInput,
    options: AuditOptions,
    clock: _Clock,
    writer: TableWriter,
    least: int,
) -> AuditResult:
    window = options.window
    clock.next("the conditions, their plans and the senders")
    # One scan of the CMs: their distinct conditions and senders, and the count and span
    # of those in the window.
    plans = plan_set(data.cms, chosen=sent_in(window), senders=True)
    cut = plans.chosen
    assert cut is not None
    clock.step("decoded the conditions")
    partitions = partitions_for(spark, int(cut["cms"]), least)
    if launch_setting(spark, SHUFFLE_PARTITIONS) is None:  # audit_settings restores it
        spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
    cached = _CachedFrames(data, plans, window, partitions)
    cms, acks = cached.build()
    bucket = _bucket(options, cut)
    clock.next("the cut, every CM judged; the latency histogram")
    # The per-CM job and the histogram's both read the two caches and need nothing from
    # each other: the per-CM one is planned and submitted from a second thread, so its
    # planning and the driver's work on the histogram overlap the running jobs, and its
    # tasks take the cores the histogram's last tasks leave idle (each cached partition is
    # built once: a task that reaches one being built waits for it).
    with run_alongside(spark, lambda: _judged(plans, cms, acks, options, bucket)) as judging:
        ack_counts = _write_latencies(acks, plans, writer)
        clock.step("read the cut; latencies and clocks")
        rollup = judging.result()
    if rollup["collided"]:
        # Two CMs share a ``cm_key``: number them apart and build the CM frames again.
        ranks = cm_ranks(cms)
        cached.release()
        cms, acks = cached.build(ranks)
        rollup = _judged(plans, cms, acks, options, bucket)
    clock.next("the outcome tables")
    candidates = _with_ids(cms, rollup["candidates"])
    for name in ("rates_by_sender", "rates_by_shape", "outcomes_over_time", "destinations"):
        writer.rows(name, rollup[name], SMALL_SCHEMAS[name])
    clock.step("re-evaluated and rated the CMs")

    overall = {key: int(value) for key, value in rollup["overall"].items()}
    frames = AuditFrames(plans, cms, acks)
    clock.next("the detail tables")
    late_metrics = write_detail_tables(
        spark, data, window, frames, candidates, overall, ack_counts, writer
    )
    clock.step("wrote the detail tables")
    cached.release()
    clock.next("the spheres re-judged")
    spheres = write_sphere_tables(data, window, writer)
    clock.step("re-judged the spheres")

    totals = {
        "cms": int(cut["cms"]),
        "decided": overall.get("decided", 0),
        "pending": overall.get("pending", 0),
        "native_cms": overall.get("native_cms", 0),
        "shapes": len(rollup["rates_by_shape"]),
        "acks": ack_counts["facts"] + ack_counts["other_rows"],
    }
    clock.next("summary.json and report.html")
    return _write_summary(spark, options, clock, writer, totals, ack_counts, late_metrics, spheres)


def _write_latencies(acks: DataFrame, plans: PlanSet, writer: TableWriter) -> dict[str, int]:
    """The latency, histogram and receiver tables from the histogram's one job over the
    cached acks; returns the acks' counts (:meth:`Histograms.totals`)."""
    histograms = Histograms(histogram_frame(acks).toArrow(), plans.destinations)
    ack_counts = histograms.totals()
    writer.rows("latency", histograms.latency_rows(), SMALL_SCHEMAS["latency"])
    writer.rows(
        "latency_histogram", histograms.histogram_rows(), SMALL_SCHEMAS["latency_histogram"]
    )
    receivers = receiver_rows(histograms.receiver_metrics(), histograms.relay_by_receiver())
    writer.rows("receivers", receivers, SMALL_SCHEMAS["receivers"])
    return ack_counts


def _write_summary(
    spark: SparkSession,
    options: AuditOptions,
    clock: _Clock,
    writer: TableWriter,
    totals: dict[str, int],
    ack_counts: dict[str, int],
    late_metrics: dict[str, int],
    spheres: dict[str, int],
) -> AuditResult:
    """The metrics and checks over the written tables, ``summary.json`` and
    ``report.html`` (once every table is written)."""
    writer.wait()
    counts = dict(writer.counts)
    for problem in anomalies.PROBLEMS:
        counts[f"status:{problem}"] = ack_counts[problem]
    for metric, value in late_metrics.items():
        counts[f"metric:{metric}"] = value
    counts["metric:sphere_disagreements"] = spheres["disagreements"]
    counts["metric:sphere_member_mismatches"] = spheres["member_mismatches"]
    metrics = metrics_from(totals, counts, writer.collected)
    results = run_checks(metrics, options.checks)
    verdict = status(results)
    summary = build_summary(
        status=verdict,
        window=options.window,
        source=options.source,
        spark=spark,
        totals=totals,
        metrics=metrics,
        checks=results,
        counts=counts,
        collected=writer.collected,
        timings=clock.timings,
        spheres=spheres,
    )
    out = None if options.out is None else str(options.out)
    if out is not None:
        text = json.dumps(summary, indent=2, default=str) + "\n"
        storage.write_text(spark, child(out, "summary.json"), text)
        storage.write_text(spark, child(out, "report.html"), render(summary, writer.collected))
    clock.step(f"wrote summary.json and report.html: {verdict}")
    summary["timings_s"] = clock.timings
    return AuditResult(verdict, summary, out, clock.timings, writer.tables)


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


def _bucket(options: AuditOptions, cut: Any) -> int:
    """The ``outcomes_over_time`` bucket: given, or about 48 over the CMs' time span."""
    if options.bucket_seconds is not None:
        return options.bucket_seconds
    first, last = cut["first"], cut["last"]
    if options.window.since is not None:
        first = options.window.since.replace(tzinfo=None)
    span = (last - first).total_seconds() if first is not None and last is not None else 0.0
    return rates.bucket_seconds_for(span)
