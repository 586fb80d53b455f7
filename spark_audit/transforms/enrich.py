"""The joined frames the metrics are computed from: per ack, and per expected copy.

Durations are in milliseconds (``double``), computed from integer microseconds so that
nothing is lost to floating-point timestamps. Receiver timestamps (``read_at``,
``committed_at``) and sender/evaluator timestamps (``sent_at``, ``received_at``) come from
different clocks; :mod:`spark_audit.transforms.skew` bounds the difference.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.reevaluate import well_formed


def _ms(later: Column, earlier: Column) -> Column:
    return (later - earlier) / F.lit(1000.0)


def ack_facts(cms_planned: DataFrame, acks: DataFrame) -> DataFrame:
    """Every well-formed ack of a known CM, with the CM's columns and its latencies.

    ``pickup_ms`` = read_at - sent_at; ``process_ms`` = committed_at - sent_at (COMMIT
    acks); ``work_ms`` = committed_at - read_at; ``relay_ms`` = received_at minus the
    ack's own event (committed_at for a COMMIT ack, read_at for a READ ack): the time the
    ack spent in the receiver's outbox, its relay, RabbitMQ and the evaluator's intake.
    """
    cms = cms_planned.select(
        "cm_id", "sender", "sent_at", "shape", "state", "decided_at", "evaluation_deadline"
    )
    sent, read = F.unix_micros("sent_at"), F.unix_micros("read_at")
    commit = F.when(F.col("kind") == "commit", F.unix_micros("committed_at"))
    received = F.unix_micros("received_at")
    return (
        acks.where(well_formed())
        .join(cms, "cm_id")
        .select(
            "*",
            _ms(read, sent).alias("pickup_ms"),
            _ms(commit, sent).alias("process_ms"),
            _ms(commit, read).alias("work_ms"),
            _ms(received, F.coalesce(commit, read)).alias("relay_ms"),
        )
    )


def copy_facts(
    cms_planned: DataFrame, acks: DataFrame, compensations: DataFrame, until: datetime
) -> DataFrame:
    """One row per destination of every valid CM's condition, with its deadline facts.

    ``pickup_missed``/``process_missed`` are set only for CMs whose evaluation deadline has
    passed at ``until`` (their facts are final): TRUE when no ack (recipient-filtered where
    the destination names one) was read / committed by the tightest deadline that applies
    to the destination. ``compensated`` says a compensation was released to it.
    """
    copies = (
        cms_planned.where(F.col("valid"))
        .select(
            "cm_id",
            "sender",
            "shape",
            "state",
            F.unix_micros("sent_at").alias("sent_us"),
            (F.col("evaluation_deadline") <= F.lit(until)).alias("final"),
            F.inline("destinations"),
        )
        .withColumnRenamed("recipient", "named_recipient")
    )
    evidence = acks.where(well_formed()).select(
        "cm_id",
        "destination",
        F.col("recipient").alias("ack_recipient"),
        F.unix_micros("read_at").alias("read_us"),
        F.when(F.col("kind") == "commit", F.unix_micros("committed_at")).alias("commit_us"),
    )
    matched = F.col("read_us").isNotNull() & (
        F.col("named_recipient").isNull() | (F.col("ack_recipient") == F.col("named_recipient"))
    )
    keys = [
        "cm_id",
        "destination",
        "sender",
        "shape",
        "state",
        "sent_us",
        "final",
        "named_recipient",
        "is_topic",
        "required",
        "pickup_ms",
        "process_ms",
    ]
    per_copy = (
        copies.join(evidence, ["cm_id", "destination"], "left")
        .groupBy(*keys)
        .agg(
            F.count(F.when(matched, 1)).alias("acks"),
            F.min(F.when(matched, F.col("read_us"))).alias("first_read_us"),
            F.min(F.when(matched, F.col("commit_us"))).alias("first_commit_us"),
        )
    )
    released = (
        compensations.where(F.col("released_at").isNotNull())
        .select("cm_id", "destination", F.lit(True).alias("compensated"))
        .dropDuplicates(["cm_id", "destination"])
    )

    def missed(ms: str, first: str) -> Column:
        deadline = F.col("sent_us") + F.col(ms) * F.lit(1000)
        on_time = F.coalesce(F.col(first) <= deadline, F.lit(False))
        return F.when(F.col(ms).isNotNull() & F.col("final"), ~on_time)

    return per_copy.join(released, ["cm_id", "destination"], "left").select(
        *keys,
        "acks",
        missed("pickup_ms", "first_read_us").alias("pickup_missed"),
        missed("process_ms", "first_commit_us").alias("process_missed"),
        F.coalesce(F.col("compensated"), F.lit(False)).alias("compensated"),
    )
