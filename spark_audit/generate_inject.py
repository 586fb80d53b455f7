"""The injected faults of :mod:`spark_audit.generate`, and the final store tables.

Every injected set is chosen by ordering candidates on a seeded hash and taking the first
``k`` (``orderBy().limit()``), so the choice is deterministic and the counts are exact; a
request that the generated history cannot satisfy raises ``ValueError``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from condmsg.archive.layout import ACKS, ANOMALIES, CMS, COMPENSATIONS, COPIES
from condmsg.core.timeutil import to_epoch_us
from spark_audit.generate_spec import GenerateSpec, uniform
from spark_audit.schemas import conform

#: A stale CM's evaluation deadline is at least this long before ``until`` (µs).
STALE_MARGIN_US = 70_000_000
LATE_AFTER_DECISION_US = 3_000_000


def _ranked(frame: DataFrame, order: Column, k: int, what: str) -> DataFrame:
    """The first ``k`` rows of ``frame`` by ``order``, numbered 1..k in ``rank``."""
    if k == 0:
        return frame.limit(0).withColumn("rank", F.lit(0))
    chosen = frame.orderBy(order).limit(k).withColumn("_o", order)
    ranked = chosen.withColumn("rank", F.row_number().over(Window.orderBy("_o"))).drop("_o")
    found = ranked.count()
    if found < k:
        raise ValueError(f"cannot inject {k} {what}: only {found} candidates (generate more CMs)")
    return ranked


def _u(seed: int, salt: int, *columns: str) -> Column:
    return uniform(*(F.col(c) for c in columns), seed, salt)


def inject(
    spark: SparkSession, spec: GenerateSpec, cms: DataFrame, acks: DataFrame
) -> tuple[dict[str, DataFrame], dict[str, int]]:
    """The five store tables with the faults of ``spec`` injected, and their counts."""
    seed, until_us = spec.seed, to_epoch_us(spec.until)
    grace_us = spec.ack_grace_ms * 1000
    n_late = spec.late_changing + spec.late_harmless
    flights = cms.where(
        (F.col("template_name") == "flight") & (F.col("decided_us") <= until_us - 10_000_000)
    ).join(acks.select("cm_id").distinct(), "cm_id", "left_anti")
    late = _ranked(flights, _u(seed, 30, "id"), n_late, "late acks").withColumn(
        "changing", F.col("rank") <= spec.late_changing
    )
    pool = cms.where(F.col("e_us") < until_us - STALE_MARGIN_US).join(
        late.select("cm_id"), "cm_id", "left_anti"
    )
    n_pick = spec.stale_pending + spec.wrong_verdicts
    picked = _ranked(pool, _u(seed, 31, "id"), n_pick, "stale/wrong CMs").select(
        "cm_id",
        (F.col("rank") <= spec.stale_pending).alias("stale"),
        (F.col("rank") > spec.stale_pending).alias("wrong"),
    )
    final = _final_cms(cms, picked, until_us, grace_us)

    late_acks = _late_acks(late)
    visible = acks.where(F.col("received_at") <= F.timestamp_micros(F.lit(until_us)))
    topics = {d for t in spec.templates for d, _, topic in t.slots() if topic}
    queue_acks = visible.where(~F.col("destination").isin(*topics)) if topics else visible
    again = _ranked(
        queue_acks, _u(seed, 32, "ack_id"), spec.multiple_consumptions, "second acks"
    ).drop("rank")
    again = again.withColumn("ack_id", F.concat(F.col("ack_id"), F.lit("-again")))
    orphans = _orphans(spark, spec)
    duplicates = _ranked(
        visible.where(F.col("received_at") <= F.timestamp_micros(F.lit(until_us - 2_000_000))),
        _u(seed, 33, "ack_id"),
        spec.duplicates,
        "duplicate anomalies",
    )
    anomalies = _anomalies(duplicates, orphans, spec.duplicates)
    all_acks = (
        visible.unionByName(conform(late_acks, ACKS))
        .unionByName(conform(again, ACKS))
        .unionByName(conform(orphans, ACKS))
    )
    tables = {
        "cms": conform(final, CMS),
        "copies": conform(_copies(cms), COPIES),
        "acks": conform(all_acks, ACKS),
        "compensations": conform(_compensations(final, cms, until_us), COMPENSATIONS),
        "anomalies": conform(anomalies, ANOMALIES),
    }
    counts = {
        name: getattr(spec, name)
        for name in (
            "wrong_verdicts",
            "late_harmless",
            "late_changing",
            "duplicates",
            "orphans",
            "multiple_consumptions",
            "stale_pending",
        )
    }
    return tables, counts


def _late_acks(late: DataFrame) -> DataFrame:
    """One read ack per late CM on its first destination, received after the decision:
    read in time where it changes the verdict, after the evaluation instant otherwise."""
    return late.select(
        F.concat(F.col("cm_id"), F.lit("-late")).alias("ack_id"),
        "cm_id",
        F.col("slots")[0]["destination"].alias("destination"),
        F.lit(None).cast("string").alias("recipient"),
        F.concat(F.lit("rcv-"), F.col("slots")[0]["destination"]).alias("receiver"),
        F.lit("read").alias("kind"),
        F.timestamp_micros(
            F.when(F.col("changing"), F.col("sent_us") + 1_000_000).otherwise(
                F.col("e_us") + 2_000_000
            )
        ).alias("read_at"),
        F.lit(None).cast("timestamp").alias("committed_at"),
        F.timestamp_micros(F.col("decided_us") + LATE_AFTER_DECISION_US).alias("received_at"),
        F.when(F.col("changing"), F.lit("changes_verdict"))
        .otherwise(F.lit("after_decision"))
        .alias("status"),
    )


def _anomalies(duplicates: DataFrame, orphans: DataFrame, n_duplicates: int) -> DataFrame:
    """The anomaly rows of the redelivered acks and of the acks for unknown CMs."""
    return duplicates.select(
        F.col("rank").cast("long").alias("id"),
        F.lit("duplicate").alias("kind"),
        "cm_id",
        "ack_id",
        "destination",
        "recipient",
        F.lit("ack id already stored (redelivered ack)").alias("detail"),
        (F.col("received_at") + F.expr("INTERVAL 1 SECOND")).alias("recorded_at"),
    ).unionByName(
        orphans.select(
            (F.col("n") + n_duplicates + 1).cast("long").alias("id"),
            F.lit("unknown_cm").alias("kind"),
            "cm_id",
            "ack_id",
            "destination",
            "recipient",
            F.lit("ack for a CM this store does not know").alias("detail"),
            (F.col("received_at") + F.expr("INTERVAL 1 MILLISECOND")).alias("recorded_at"),
        )
    )


def _final_cms(cms: DataFrame, picked: DataFrame, until_us: int, grace_us: int) -> DataFrame:
    flagged = cms.join(F.broadcast(picked), "cm_id", "left")
    stale = F.coalesce(F.col("stale"), F.lit(False))
    wrong = F.coalesce(F.col("wrong"), F.lit(False))
    visible = (F.col("decided_us") <= until_us) & ~stale
    flipped = F.when(F.col("verdict") == "satisfied", F.lit("violated")).otherwise(
        F.lit("satisfied")
    )
    return flagged.select(
        "cm_id",
        "sender",
        F.timestamp_micros("sent_us").alias("sent_at"),
        "condition_json",
        F.timestamp_micros("e_us").alias("evaluation_deadline"),
        F.lit("application/json").alias("content_type"),
        F.lit(256).cast("long").alias("payload_size"),
        F.lit(False).alias("notify_success"),
        F.when(~visible, F.lit("pending"))
        .when(wrong, flipped)
        .otherwise(F.col("verdict"))
        .alias("state"),
        F.when(visible, F.timestamp_micros("decided_us")).alias("decided_at"),
        F.when(visible, F.timestamp_micros(F.col("decided_us") - grace_us)).alias("effective_at"),
        F.when(visible, F.lit('["synthetic history"]')).alias("reasons_json"),
        F.when(visible, F.lit("generator")).alias("decided_by"),
    )


def _orphans(spark: SparkSession, spec: GenerateSpec) -> DataFrame:
    start_us = to_epoch_us(spec.start)
    read_us = F.lit(start_us) + F.col("n") * F.lit(spec.interval_ms * 1000)
    return spark.range(0, spec.orphans).select(
        F.col("id").alias("n"),
        F.concat(F.lit("orphan-ack-"), F.col("id")).alias("ack_id"),
        F.concat(F.lit("orphan-cm-"), F.col("id")).alias("cm_id"),
        F.lit("qa").alias("destination"),
        F.lit(None).cast("string").alias("recipient"),
        F.lit("rcv-qa").alias("receiver"),
        F.lit("read").alias("kind"),
        F.timestamp_micros(read_us).alias("read_at"),
        F.lit(None).cast("timestamp").alias("committed_at"),
        F.timestamp_micros(read_us + 5000).alias("received_at"),
        F.lit("counted").alias("status"),
    )


def _copies(cms: DataFrame) -> DataFrame:
    return cms.select("cm_id", F.inline("copies")).select(
        "cm_id",
        "destination",
        "recipient",
        F.concat_ws(":", "cm_id", "destination").alias("message_id"),
        "exchange",
        F.col("destination").alias("routing_key"),
        "requires",
        F.lit(1).alias("parts"),
    )


def _compensations(final: DataFrame, cms: DataFrame, until_us: int) -> DataFrame:
    violated = final.where(F.col("state") == "violated").select("cm_id", "decided_at")
    released = F.col("decided_at") + F.expr("INTERVAL 10 MILLISECONDS")
    return (
        violated.join(cms.select("cm_id", "copies"), "cm_id")
        .select("cm_id", "decided_at", F.inline("copies"))
        .select(
            "cm_id",
            "destination",
            F.lit(64).cast("long").alias("body_bytes"),
            F.lit("application/json").alias("content_type"),
            F.lit(True).alias("system_generated"),
            F.when(released <= F.timestamp_micros(F.lit(until_us)), released).alias("released_at"),
        )
    )
