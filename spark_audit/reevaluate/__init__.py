"""Independent re-evaluation of every decided CM, compared with the stored verdict.

DESIGN section 6: the stored verdict equals ``evaluate`` over the acks received before the
decision, at the decision's effective time. The audit takes the acks the evaluator says it
counted (``status = 'counted'``; whether those labels agree with ``received_at`` and
``decided_at`` is a separate check in :mod:`spark_audit.transforms.anomalies`), judges
each decided CM at its ``effective_at``, natively where the plan allows
(:mod:`.native`) and with ``condmsg.evaluate`` otherwise (:mod:`.fallback`), and reports
every CM whose recomputed verdict differs, with ``evaluate``'s reasons as evidence.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.reevaluate.fallback import python_verdicts
from spark_audit.reevaluate.native import native_verdicts

VERDICTS = ("satisfied", "violated")


def well_formed(prefix: str = "") -> Column:
    """An ack row ``condmsg.Ack`` accepts (malformed rows are reported, never judged)."""
    kind = F.col(f"{prefix}kind")
    read, committed = F.col(f"{prefix}read_at"), F.col(f"{prefix}committed_at")
    return (
        read.isNotNull()
        & F.col(f"{prefix}destination").isNotNull()
        & (
            ((kind == "read") & committed.isNull())
            | ((kind == "commit") & committed.isNotNull() & (committed >= read))
        )
    )


def recompute(cases: DataFrame, acks: DataFrame, *, native: bool = True) -> DataFrame:
    """``cm_id, verdict, path, reasons, error`` for ``cases`` judged at their ``at``.

    ``cases`` carries the plan columns (``with_plans``) and ``cm_id, condition_json,
    sent_at, at``; ``acks`` the acks to judge by. ``native=False`` sends every case
    through ``condmsg.evaluate`` (used by tests to compare both paths).
    """
    acks = acks.where(well_formed())
    valid = F.coalesce(F.col("valid"), F.lit(False))
    use_native = valid & F.col("native") & F.lit(native)
    native_part = native_verdicts(cases.where(use_native), acks).select(
        "cm_id",
        "verdict",
        F.lit("native").alias("path"),
        F.lit(None).cast("array<string>").alias("reasons"),
        F.lit(None).cast("string").alias("error"),
    )
    python_part = python_verdicts(cases.where(valid & ~use_native), acks).select(
        "cm_id", "verdict", F.lit("python").alias("path"), "reasons", "error"
    )
    invalid_part = cases.where(~valid).select(
        "cm_id",
        F.lit(None).cast("string").alias("verdict"),
        F.lit("invalid").alias("path"),
        F.array().cast("array<string>").alias("reasons"),
        F.coalesce(F.col("error"), F.lit("condition does not decode")).alias("error"),
    )
    return native_part.unionByName(python_part).unionByName(invalid_part)


def decided_cases(cms_planned: DataFrame) -> DataFrame:
    """The decided CMs, as cases to judge at their ``effective_at``."""
    return cms_planned.where(
        F.col("state").isin(*VERDICTS)
        & F.col("effective_at").isNotNull()
        & F.col("decided_at").isNotNull()
    ).withColumn("at", F.col("effective_at"))


def counted_acks(acks: DataFrame) -> DataFrame:
    return acks.where(F.col("status") == "counted")


def verdict_comparison(cms_planned: DataFrame, acks: DataFrame) -> DataFrame:
    """Per decided CM: stored vs recomputed verdict (``agrees``), with the path used."""
    cases = decided_cases(cms_planned)
    verdicts = recompute(cases, counted_acks(acks))
    return (
        cases.select(
            "cm_id",
            "sender",
            "shape",
            "condition_json",
            "sent_at",
            "at",
            "decided_at",
            "effective_at",
            F.col("state").alias("stored_verdict"),
            "reasons_json",
        )
        .join(
            verdicts.select("cm_id", F.col("verdict").alias("recomputed_verdict"), "path", "error"),
            "cm_id",
            "left",
        )
        .withColumn(
            "agrees",
            F.coalesce(F.col("recomputed_verdict") == F.col("stored_verdict"), F.lit(False)),
        )
    )


def discrepancies(comparison: DataFrame, acks: DataFrame) -> DataFrame:
    """The disagreeing CMs with evidence: ``evaluate``'s reasons over the counted acks."""
    wrong = comparison.where(~F.col("agrees"))
    counted = counted_acks(acks).where(well_formed())
    explained = python_verdicts(wrong, counted).select(
        "cm_id",
        F.col("verdict").alias("python_verdict"),
        "reasons",
        F.col("error").alias("python_error"),
    )
    evidence = (
        counted.join(wrong.select("cm_id"), "cm_id", "left_semi")
        .groupBy("cm_id")
        .agg(F.count(F.lit(1)).alias("counted_acks"))
    )
    return (
        wrong.join(explained, "cm_id", "left")
        .join(evidence, "cm_id", "left")
        .select(
            "cm_id",
            "sender",
            "shape",
            "stored_verdict",
            "recomputed_verdict",
            "path",
            "python_verdict",
            "decided_at",
            "effective_at",
            F.coalesce(F.col("counted_acks"), F.lit(0)).alias("counted_acks"),
            "reasons",
            F.col("reasons_json").alias("stored_reasons_json"),
            F.coalesce(F.col("error"), F.col("python_error")).alias("error"),
        )
    )


def late_ack_effects(cms_planned: DataFrame, comparison: DataFrame, acks: DataFrame) -> DataFrame:
    """Per decided CM with acks not counted: would they have changed the verdict?

    The CM is judged again at the same ``effective_at`` with every ack (counted and late);
    ``changes_verdict`` compares that with the verdict over the counted acks alone, so it
    measures the late acks' effect, independent of whether the stored verdict was right.
    ``flagged`` says whether the evaluator marked one of them ``changes_verdict``.
    """
    judged = acks.where(well_formed())
    late = (
        judged.where(F.col("status") != "counted")
        .groupBy("cm_id")
        .agg(
            F.count(F.lit(1)).alias("late_acks"),
            F.max((F.col("status") == "changes_verdict").cast("int")).alias("flag"),
        )
    )
    cases = decided_cases(cms_planned).join(late, "cm_id", "left_semi")
    with_late = recompute(cases, judged.join(late.select("cm_id"), "cm_id", "left_semi"))
    return (
        late.join(comparison.select("cm_id", "stored_verdict", "recomputed_verdict"), "cm_id")
        .join(with_late.select("cm_id", F.col("verdict").alias("verdict_with_late")), "cm_id")
        .select(
            "cm_id",
            "late_acks",
            "stored_verdict",
            F.col("recomputed_verdict").alias("verdict_counted"),
            "verdict_with_late",
            F.coalesce(
                F.col("verdict_with_late") != F.col("recomputed_verdict"), F.lit(False)
            ).alias("changes_verdict"),
            (F.col("flag") == 1).alias("flagged"),
        )
    )
