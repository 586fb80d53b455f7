"""Latency percentiles and distributions (``percentile_approx``, one pass each)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

PERCENTILES = (0.5, 0.9, 0.99)
#: ``percentile_approx`` accuracy: relative rank error about 1/accuracy.
ACCURACY = 1000
METRICS = ("pickup_ms", "process_ms", "work_ms", "relay_ms")


def _percentiles(metric: str) -> list[Column]:
    values = F.percentile_approx(metric, list(PERCENTILES), ACCURACY)
    name = metric.removesuffix("_ms")
    return [values[i].alias(f"{name}_p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)]


def latency_percentiles(ack_facts: DataFrame) -> DataFrame:
    """p50/p90/p99 of every latency per destination and recipient, with subtotals.

    ``level`` is ``recipient`` (one destination and recipient; ``recipient`` null for acks
    without one), ``destination`` (all recipients of a destination) or ``all``.
    """
    level = (
        F.when(F.grouping_id() == 0, F.lit("recipient"))
        .when(F.grouping_id() == 1, F.lit("destination"))
        .otherwise(F.lit("all"))
    )
    return (
        ack_facts.rollup("destination", "recipient")
        .agg(
            level.alias("level"),
            F.count(F.lit(1)).alias("acks"),
            F.count("process_ms").alias("commit_acks"),
            *(c for metric in METRICS for c in _percentiles(metric)),
        )
        .orderBy("level", "destination", "recipient")
    )


def latency_histogram(ack_facts: DataFrame) -> DataFrame:
    """Counts of pickup and processing latencies in power-of-two millisecond bins.

    ``bin`` k >= 1 holds ``[2^(k-1), 2^k)`` ms, bin 0 holds ``[0, 1)`` ms and bin -1 holds
    negative latencies (only possible with a receiver clock behind the sender's).
    """
    values = (
        ack_facts.select(
            F.explode(
                F.array(
                    F.struct(F.lit("pickup").alias("metric"), F.col("pickup_ms").alias("ms")),
                    F.struct(F.lit("process").alias("metric"), F.col("process_ms").alias("ms")),
                )
            ).alias("v")
        )
        .select("v.metric", "v.ms")
        .where(F.col("ms").isNotNull())
    )
    bin_ = (
        F.when(F.col("ms") < 0, F.lit(-1))
        .when(F.col("ms") < 1, F.lit(0))
        .otherwise(F.floor(F.log2(F.col("ms"))).cast("int") + 1)
    )
    return values.groupBy("metric", bin_.alias("bin")).count().orderBy("metric", "bin")
