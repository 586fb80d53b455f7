"""Outcome, compensation and deadline-miss rates (by sender, condition shape, destination,
and over time)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


def _ratio(part: Column, whole: Column) -> Column:
    return F.when(whole > 0, part / whole)


def _outcome_counts() -> list[Column]:
    state = F.col("state")
    return [
        F.count(F.lit(1)).alias("cms"),
        F.sum((state == "satisfied").cast("long")).alias("satisfied"),
        F.sum((state == "violated").cast("long")).alias("violated"),
        F.sum((state == "pending").cast("long")).alias("pending"),
        F.sum(F.col("compensated").cast("long")).alias("compensated"),
    ]


def _with_rates(frame: DataFrame) -> DataFrame:
    decided = F.col("satisfied") + F.col("violated")
    return frame.select(
        "*",
        _ratio(F.col("satisfied"), decided).alias("success_rate"),
        _ratio(F.col("violated"), decided).alias("failure_rate"),
        _ratio(F.col("compensated"), decided).alias("compensation_rate"),
    )


def compensated_cms(cms: DataFrame, compensations: DataFrame) -> DataFrame:
    """``cms`` with ``compensated``: a compensation was released for the CM."""
    released = (
        compensations.where(F.col("released_at").isNotNull())
        .select("cm_id")
        .distinct()
        .withColumn("compensated", F.lit(True))
    )
    return cms.join(released, "cm_id", "left").withColumn(
        "compensated", F.coalesce(F.col("compensated"), F.lit(False))
    )


def outcome_rates(cms_compensated: DataFrame, by: str) -> DataFrame:
    """Success, failure and compensation rates of the CMs grouped by ``by``
    (``sender`` or ``shape``). Rates are over decided CMs; pending ones are counted apart."""
    return _with_rates(cms_compensated.groupBy(by).agg(*_outcome_counts())).orderBy(by)


def destination_rates(copy_facts: DataFrame) -> DataFrame:
    """Per destination: outcomes of the CMs it took part in, compensations released to
    it, and its pickup / processing deadline-miss rates (over final CMs only)."""
    counts = copy_facts.groupBy("destination").agg(
        *_outcome_counts(),
        F.count("pickup_missed").alias("pickup_deadlines"),
        F.sum(F.col("pickup_missed").cast("long")).alias("pickup_misses"),
        F.count("process_missed").alias("process_deadlines"),
        F.sum(F.col("process_missed").cast("long")).alias("process_misses"),
    )
    return (
        _with_rates(counts)
        .withColumn("pickup_miss_rate", _ratio(F.col("pickup_misses"), F.col("pickup_deadlines")))
        .withColumn(
            "process_miss_rate", _ratio(F.col("process_misses"), F.col("process_deadlines"))
        )
        .withColumnRenamed("cms", "copies")
        .orderBy("destination")
    )


def outcomes_over_time(cms: DataFrame, bucket_seconds: int) -> DataFrame:
    """CM outcomes by ``sent_at`` bucket (``bucket_start``, UTC)."""
    seconds = F.unix_seconds("sent_at")
    start = F.timestamp_seconds(F.floor(seconds / bucket_seconds) * bucket_seconds)
    state = F.col("state")
    return (
        cms.groupBy(start.alias("bucket_start"))
        .agg(
            F.sum((state == "satisfied").cast("long")).alias("satisfied"),
            F.sum((state == "violated").cast("long")).alias("violated"),
            F.sum((state == "pending").cast("long")).alias("pending"),
        )
        .orderBy("bucket_start")
    )


def bucket_seconds_for(span_seconds: float, buckets: int = 48) -> int:
    """A round bucket width giving at most about ``buckets`` buckets over the span."""
    for width in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 6 * 3600, 86400, 7 * 86400):
        if span_seconds / width <= buckets:
            return width
    return 30 * 86400
