"""Ack anomalies: orphans, duplicates, multiple consumptions, late acks, status labels,
malformed rows, and CMs left pending past their evaluation deadline."""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from condmsg.sender_tables import AckStatus, AnomalyKind
from spark_audit.reevaluate import well_formed

STATUSES = tuple(s.value for s in AckStatus)


def orphan_acks(acks: DataFrame, cms: DataFrame, anomalies: DataFrame) -> DataFrame:
    """Acks for CMs the store does not know: rows of the ack table without a CM, and
    ``unknown_cm`` anomalies; one row per ack id with where it was seen (``source``)."""
    stored = acks.join(cms.select("cm_id"), "cm_id", "left_anti").select(
        "ack_id", "cm_id", "destination", "receiver", F.lit(1).alias("in_acks")
    )
    recorded = anomalies.where(F.col("kind") == AnomalyKind.UNKNOWN_CM.value).select(
        F.coalesce("ack_id", F.concat(F.lit("anomaly:"), F.col("id").cast("string"))).alias(
            "ack_id"
        ),
        "cm_id",
        "destination",
        F.lit(None).cast("string").alias("receiver"),
        F.lit(2).alias("in_anomalies"),
    )
    both = stored.unionByName(recorded, allowMissingColumns=True)
    source = (
        F.when(F.max("in_acks").isNull(), F.lit("anomaly"))
        .when(F.max("in_anomalies").isNull(), F.lit("ack_table"))
        .otherwise(F.lit("both"))
    )
    return both.groupBy("ack_id").agg(
        F.first("cm_id", ignorenulls=True).alias("cm_id"),
        F.first("destination", ignorenulls=True).alias("destination"),
        F.first("receiver", ignorenulls=True).alias("receiver"),
        source.alias("source"),
    )


def duplicate_acks(anomalies: DataFrame) -> DataFrame:
    """Redelivered acks the evaluator recognised by their ack id (``duplicate`` anomalies)."""
    return anomalies.where(F.col("kind") == AnomalyKind.DUPLICATE.value).select(
        "id", "ack_id", "cm_id", "destination", "recipient", "detail", "recorded_at"
    )


def anomaly_counts(anomalies: DataFrame) -> DataFrame:
    return anomalies.groupBy("kind").count().orderBy("kind")


def multiple_consumptions(acks: DataFrame, copy_facts: DataFrame) -> DataFrame:
    """Copies acknowledged more than once under different ack ids.

    A queue copy is consumed once, and each recipient's copy of a topic destination once;
    two acks for one consumption mean a redelivery produced a second ack (the receiver's
    inbox should have prevented it).
    """
    topics = copy_facts.select("cm_id", "destination", "is_topic").distinct()
    consumer = F.when(F.col("is_topic"), F.coalesce("recipient", F.lit(""))).otherwise(F.lit(""))
    return (
        acks.where(well_formed())
        .join(topics, ["cm_id", "destination"])
        .groupBy("cm_id", "destination", consumer.alias("consumer"))
        .agg(
            F.count(F.lit(1)).alias("acks"), F.sort_array(F.collect_list("ack_id")).alias("ack_ids")
        )
        .where(F.col("acks") > 1)
    )


def late_acks(acks: DataFrame, cms: DataFrame) -> DataFrame:
    """Acks of decided CMs that were not counted (received after the decision)."""
    decided = cms.where(F.col("decided_at").isNotNull()).select("cm_id", "decided_at")
    return (
        acks.join(decided, "cm_id")
        .where(F.col("status") != AckStatus.COUNTED.value)
        .select(
            "ack_id",
            "cm_id",
            "destination",
            "recipient",
            "receiver",
            "status",
            "read_at",
            "committed_at",
            "received_at",
            "decided_at",
            ((F.unix_micros("received_at") - F.unix_micros("decided_at")) / F.lit(1000.0)).alias(
                "after_decision_ms"
            ),
        )
    )


def status_mismatches(acks: DataFrame, cms: DataFrame) -> DataFrame:
    """Acks whose status label contradicts the timestamps.

    * ``counted_after_decision`` (error): counted, yet received after the decision;
    * ``not_counted_before_decision`` (warning): received by ``decided_at`` but not counted,
      which a second evaluator instance racing with the intake can produce;
    * ``not_counted_while_pending`` (error): not counted although the CM is undecided.
    """
    joined = acks.join(cms.select("cm_id", "decided_at"), "cm_id")
    counted = F.col("status") == AckStatus.COUNTED.value
    received_after = F.col("received_at") > F.col("decided_at")
    problem = (
        F.when(F.col("decided_at").isNull() & ~counted, F.lit("not_counted_while_pending"))
        .when(counted & received_after, F.lit("counted_after_decision"))
        .when(~counted & ~received_after, F.lit("not_counted_before_decision"))
    )
    return (
        joined.withColumn("problem", problem)
        .where(F.col("problem").isNotNull())
        .select("ack_id", "cm_id", "status", "received_at", "decided_at", "problem")
    )


def malformed_acks(acks: DataFrame) -> DataFrame:
    """Ack rows ``condmsg.Ack`` would reject, or with an unknown status (never judged)."""
    bad = ~F.coalesce(well_formed(), F.lit(False)) | ~F.col("status").isin(*STATUSES)
    return acks.where(bad)


def stale_pending(cms: DataFrame, until: datetime, grace: timedelta) -> DataFrame:
    """CMs still pending ``grace`` after their evaluation deadline, at ``until``."""
    limit = F.lit(until - grace)
    return cms.where((F.col("state") == "pending") & (F.col("evaluation_deadline") < limit)).select(
        "cm_id", "sender", "sent_at", "evaluation_deadline"
    )
