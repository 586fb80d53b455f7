"""The audit job: inputs -> transforms -> Parquet tables, ``summary.json``, ``report.html``.

Reading happens before (:mod:`spark_audit.readers`, :mod:`spark_audit.jdbc`) and writing
only here, at the edge; everything in between is the pure transforms. The frames that
several tables derive from (CMs with their plans, the per-ack and per-copy facts, the
verdict comparison) are persisted once so the source is scanned once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from spark_audit import reevaluate
from spark_audit.checks import DEFAULT_CHECKS, CheckSpec, run_checks, status
from spark_audit.readers import AuditInput, Window
from spark_audit.report import write_report
from spark_audit.summary import build_summary, metrics_from
from spark_audit.transforms import anomalies, latency, rates, skew
from spark_audit.transforms.conditions import condition_plans, with_plans
from spark_audit.transforms.enrich import ack_facts, copy_facts

#: Tables small enough to collect for the summary and the report.
SMALL_TABLES = (
    "latency",
    "latency_histogram",
    "receivers",
    "rates_by_sender",
    "rates_by_shape",
    "destinations",
    "outcomes_over_time",
    "anomaly_counts",
)
#: Detail tables whose first rows the report shows.
SAMPLED_TABLES = ("discrepancies", "late_ack_effects", "status_mismatches", "stale_pending")
SAMPLE_ROWS = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditOptions:
    out: Path
    window: Window
    source: str
    checks: tuple[CheckSpec, ...] = DEFAULT_CHECKS
    stale_grace: timedelta = timedelta(minutes=1)
    bucket_seconds: int | None = None


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


def build_tables(
    data: AuditInput, options: AuditOptions
) -> tuple[dict[str, DataFrame], list[DataFrame]]:
    """Every output table as a DataFrame (lazy; nothing is read or written here), and the
    shared intermediate frames marked for persistence (to unpersist when done)."""
    until = options.window.until
    level = StorageLevel.MEMORY_AND_DISK
    # The windowed inputs are joins over the whole source; every table reads them, so they
    # are computed once (the totals job materialises them).
    acks = data.acks.persist(level)
    cms = with_plans(data.cms, condition_plans(data.cms)).persist(level)
    facts = ack_facts(cms, acks).persist(StorageLevel.MEMORY_AND_DISK)
    copies = copy_facts(cms, acks, data.compensations, until).persist(StorageLevel.MEMORY_AND_DISK)
    comparison = reevaluate.verdict_comparison(cms, acks).persist(StorageLevel.MEMORY_AND_DISK)
    compensated = rates.compensated_cms(cms, data.compensations)
    tables = {
        "totals": _totals(cms, acks),
        "latency": latency.latency_percentiles(facts),
        "latency_histogram": latency.latency_histogram(facts),
        "receivers": skew.receiver_clocks(facts),
        "rates_by_sender": rates.outcome_rates(compensated, "sender"),
        "rates_by_shape": rates.outcome_rates(compensated, "shape"),
        "destinations": rates.destination_rates(copies),
        "discrepancies": reevaluate.discrepancies(comparison, acks),
        "late_ack_effects": reevaluate.late_ack_effects(cms, comparison, acks),
        "late_acks": anomalies.late_acks(acks, cms),
        "orphan_acks": anomalies.orphan_acks(acks, cms, data.anomalies),
        "duplicate_acks": anomalies.duplicate_acks(data.anomalies),
        "multiple_consumptions": anomalies.multiple_consumptions(acks, copies),
        "status_mismatches": anomalies.status_mismatches(acks, cms),
        "malformed_acks": anomalies.malformed_acks(acks),
        "stale_pending": anomalies.stale_pending(cms, until, options.stale_grace),
        "invalid_conditions": cms.where(~F.col("valid")).select(
            "cm_id", "sender", "condition_json", "error"
        ),
        "anomaly_counts": anomalies.anomaly_counts(data.anomalies),
    }
    return tables, [acks, cms, facts, copies, comparison]


def _bucket_seconds(options: AuditOptions, totals: dict[str, Any]) -> int:
    """The ``outcomes_over_time`` bucket: given, or about 48 over the CMs' time span."""
    first, last = totals.pop("first_sent_at"), totals.pop("last_sent_at")
    if options.bucket_seconds is not None:
        return options.bucket_seconds
    if options.window.since is not None:
        first = options.window.since.replace(tzinfo=None)
    span = (last - first).total_seconds() if first is not None and last is not None else 0.0
    return rates.bucket_seconds_for(span)


def _totals(cms: DataFrame, acks: DataFrame) -> DataFrame:
    per_cm = cms.agg(
        F.count(F.lit(1)).alias("cms"),
        F.sum((F.col("state") != "pending").cast("long")).alias("decided"),
        F.sum((F.col("state") == "pending").cast("long")).alias("pending"),
        F.sum((F.col("valid") & F.col("native")).cast("long")).alias("native_cms"),
        F.countDistinct("shape").alias("shapes"),
        F.min("sent_at").alias("first_sent_at"),
        F.max("sent_at").alias("last_sent_at"),
    )
    return per_cm.crossJoin(acks.agg(F.count(F.lit(1)).alias("acks")))


def _write_small(frame: DataFrame, path: Path) -> tuple[int, list[dict[str, Any]]]:
    """Collect a small table once (Arrow) and write it from the driver: one Spark job."""
    table = frame.toArrow()
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path / "part-00000.parquet")
    return table.num_rows, table.to_pylist()


def _observed(name: str) -> list[Column]:
    """Metrics gathered while a detail table is written (no extra pass over it)."""
    observed = [F.count(F.lit(1)).alias(name)]
    if name == "status_mismatches":
        for problem in (
            "counted_after_decision",
            "not_counted_while_pending",
            "not_counted_before_decision",
        ):
            hit = (F.col("problem") == problem).cast("long")
            observed.append(F.coalesce(F.sum(hit), F.lit(0)).alias(f"status:{problem}"))
    if name == "late_ack_effects":
        changing = F.col("changes_verdict").cast("long")
        mismatch = (F.col("changes_verdict") != F.col("flagged")).cast("long")
        observed.append(
            F.coalesce(F.sum(changing), F.lit(0)).alias("metric:late_acks_changing_verdict")
        )
        observed.append(
            F.coalesce(F.sum(mismatch), F.lit(0)).alias("metric:late_ack_flag_mismatches")
        )
    return observed


def _write_detail(name: str, frame: DataFrame, path: Path) -> dict[str, int]:
    """Write a detail table with Spark, counting its rows (and more) during the write."""
    observation = Observation(name)
    frame.observe(observation, *_observed(name)).write.mode("overwrite").parquet(str(path))
    return {key: int(value or 0) for key, value in observation.get.items()}


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def run_audit(
    spark: SparkSession,
    data: AuditInput,
    options: AuditOptions,
    progress: Callable[[str], None] = print,
) -> AuditResult:
    """Run the whole audit and write its outputs under ``options.out``."""
    clock = _Clock(progress)
    out = options.out
    tables_dir = out / "tables"
    out.mkdir(parents=True, exist_ok=True)
    tables, persisted = build_tables(data, options)
    clock.step("planned")
    counts: dict[str, int] = {}
    collected: dict[str, list[dict[str, Any]]] = {}
    totals = _rows(tables.pop("totals"))[0]
    cms = persisted[1]
    tables["outcomes_over_time"] = rates.outcomes_over_time(cms, _bucket_seconds(options, totals))
    clock.step("read and decoded inputs")
    for name, frame in tables.items():
        path = tables_dir / name
        if name in SMALL_TABLES:
            counts[name], collected[name] = _write_small(frame, path)
        else:
            counts.update(_write_detail(name, frame, path))
            if name in SAMPLED_TABLES and counts[name]:
                collected[name] = _rows(spark.read.parquet(str(path)).limit(SAMPLE_ROWS))
        clock.step(f"wrote {name} ({counts[name]} rows)")
    for frame in persisted:
        frame.unpersist()
    metrics = metrics_from(totals, counts, collected)
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
        collected=collected,
        timings=clock.timings,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    write_report(out / "report.html", summary, collected)
    clock.step(f"wrote summary.json and report.html: {verdict}")
    summary["timings_s"] = clock.timings
    return AuditResult(verdict, summary, out, clock.timings)
