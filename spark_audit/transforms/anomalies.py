"""Ack anomalies: orphans, duplicates, multiple consumptions, late acks, status labels,
malformed rows.

Their counts come with the latency histogram (:data:`COUNTERS`, per receiver); the rows
come from *candidates*: one filter over the acks (:func:`ack_candidates`) keeps every row
any ack-level table can hold (and the acks of the CMs the per-CM tables explain), so each
table is then a cheap query of a small frame.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from condmsg.archive.layout import ACKS, AnomalyKind
from spark_audit.transforms import enrich
from spark_audit.transforms.conditions import same_text
from spark_audit.transforms.enrich import COUNTED_CODE, acks_only, judging_acks

PROBLEMS = ("counted_after_decision", "not_counted_while_pending", "not_counted_before_decision")


def _counted() -> Column:
    return enrich.counted()


def late() -> Column:
    """An ack of a decided CM that was not counted (received after the decision)."""
    return F.col("known") & F.col("decided_us").isNotNull() & (F.col("status_code") != COUNTED_CODE)


def problem() -> Column:
    """The status label contradicting the timestamps, if any.

    * ``counted_after_decision`` (error): counted, yet received after the decision;
    * ``not_counted_before_decision`` (warning): received by ``decided_at`` but not counted,
      which a second evaluator instance racing with the intake can produce;
    * ``not_counted_while_pending`` (error): not counted although the CM is undecided.
    """
    counted = _counted()
    received_after = F.col("received_us") > F.col("decided_us")
    return (
        F.when(~F.col("known"), F.lit(None))
        .when(F.col("decided_us").isNull() & ~counted, F.lit("not_counted_while_pending"))
        .when(counted & received_after, F.lit("counted_after_decision"))
        .when(~counted & ~received_after, F.lit("not_counted_before_decision"))
    )


def malformed() -> Column:
    """A row ``condmsg.Ack`` would reject, or with an unknown status (never judged)."""
    return ~F.col("wf") | ~(F.col("status_code") >= 0)


#: Per-ack counts gathered with the latency histogram (per receiver).
COUNTERS = ("late_acks", "malformed_acks", "orphan_rows", *PROBLEMS)


def counters() -> dict[str, Column]:
    """The conditions of :data:`COUNTERS`: late, malformed and orphan acks, and each
    status problem."""
    found = problem()
    return {
        "late_acks": late(),
        "malformed_acks": malformed(),
        "orphan_rows": ~F.col("known"),
        **{name: found == name for name in PROBLEMS},
    }


def listed() -> Column:
    """An ack an ack-level table lists for itself (late, a status problem, malformed, an
    orphan), whichever CM it belongs to."""
    return late() | problem().isNotNull() | malformed() | ~F.col("known")


def listed_keys(enriched: DataFrame) -> DataFrame:
    """``cm_key`` of every ack :func:`listed` (an orphan's: the hash of its ``cm_id``),
    one row per key: with the keys of the flagged CMs, the CMs whose acks
    :func:`ack_candidates` needs (numeric columns only: the cached acks may lack text)."""
    return acks_only(enriched).where(F.coalesce(listed(), F.lit(False))).select("cm_key").distinct()


def ack_candidates(enriched: DataFrame, flagged: DataFrame) -> DataFrame:
    """The acks any ack-level detail table can hold.

    ``flagged``: ``cm_id, discrepant, multi, late`` of the CMs whose acks are needed: as
    evidence of a discrepancy, of a multiple consumption, or to judge the CM with its
    late acks (a small frame, broadcast).
    """
    # One long equi-join key (``cm_key``), the ids compared exactly beside it: a lookup
    # per ack in a hash table keyed by longs rather than by 36-byte strings.
    keyed = flagged.select(
        enrich.cm_key().alias("_flag_key"),
        F.col("cm_id").alias("_flag_cm_id"),
        *(c for c in flagged.columns if c != "cm_id"),
    )
    on = (F.col("cm_key") == F.col("_flag_key")) & same_text("cm_id", "_flag_cm_id")
    joined = (
        acks_only(enriched).join(F.broadcast(keyed), on, "left").drop("_flag_key", "_flag_cm_id")
    )
    wanted = (
        listed()
        | F.coalesce(F.col("discrepant"), F.lit(False))
        | F.coalesce(F.col("multi"), F.lit(False))
        | F.coalesce(F.col("late"), F.lit(False))
    )
    return joined.where(F.coalesce(wanted, F.lit(False))).withColumn("problem", problem())


def _ts(column: str) -> Column:
    return F.timestamp_micros(F.col(column))


def late_acks(candidates: DataFrame) -> DataFrame:
    return candidates.where(late()).select(
        "ack_id",
        "cm_id",
        "destination",
        "recipient",
        "receiver",
        "status",
        _ts("read_us").alias("read_at"),
        _ts("committed_us").alias("committed_at"),
        _ts("received_us").alias("received_at"),
        _ts("decided_us").alias("decided_at"),
        ((F.col("received_us") - F.col("decided_us")) / F.lit(1000.0)).alias("after_decision_ms"),
    )


def status_mismatches(candidates: DataFrame) -> DataFrame:
    return candidates.where(F.col("problem").isNotNull()).select(
        "ack_id",
        "cm_id",
        "status",
        _ts("received_us").alias("received_at"),
        _ts("decided_us").alias("decided_at"),
        "problem",
    )


def malformed_acks(candidates: DataFrame) -> DataFrame:
    """The malformed rows, as stored."""
    stamps = {"read_at": "read_us", "committed_at": "committed_us", "received_at": "received_us"}
    return candidates.where(F.coalesce(malformed(), F.lit(False))).select(
        *(
            _ts(stamps[name]).alias(name) if name in stamps else F.col(name)
            for name in ACKS.column_names
        )
    )


def multiple_consumptions(candidates: DataFrame) -> DataFrame:
    """Consumptions acknowledged more than once under different ack ids.

    A queue copy is consumed once (``consumer`` empty), and each recipient's copy of a
    topic destination once (``consumer`` the recipient, ``(anonymous)`` for acks without
    one); two acks for one consumption mean a redelivery produced a second ack (the
    receiver's inbox should have prevented it).
    """
    return (
        candidates.where(
            F.coalesce(F.col("multi"), F.lit(False))
            & F.col("known")
            & F.col("wf")
            & F.col("slot").isNotNull()
        )
        .groupBy("cm_id", "destination", enrich.consumer())
        .agg(
            F.count(F.lit(1)).alias("acks"),
            F.sort_array(F.collect_list("ack_id")).alias("ack_ids"),
        )
        .where(F.col("acks") > 1)
    )


def orphan_acks(candidates: DataFrame, anomalies: DataFrame) -> DataFrame:
    """Acks for CMs the store does not know: rows of the ack table without a CM, and
    ``unknown_cm`` anomalies; one row per ack id with where it was seen (``source``)."""
    stored = candidates.where(~F.col("known")).select(
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


def anomaly_counts(anomalies: DataFrame) -> list[tuple[str, int]]:
    """``(kind, count)`` of the recorded anomalies, by kind."""
    found = anomalies.groupBy("kind").count().collect()
    return sorted((r["kind"], int(r["count"])) for r in found)


def flagged_acks(candidates: DataFrame, flag: str) -> DataFrame:
    """The well-formed acks of the CMs flagged ``flag`` (in the fallback's layout)."""
    return judging_acks(candidates.where(F.coalesce(F.col(flag), F.lit(False))))
