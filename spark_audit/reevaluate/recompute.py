"""Judging arbitrary cases with the audit's machinery (the generator and the tests use it).

:func:`recompute` runs the same stages as the audit (:mod:`spark_audit.transforms.enrich`)
on cases that need no cut: every case is judged at its ``at`` over every ack given.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_audit.reevaluate.fallback import python_verdicts
from spark_audit.schemas import SCHEMAS, local_frame
from spark_audit.transforms.conditions import PlanSet, plan_set
from spark_audit.transforms.enrich import (
    COUNTED_STATUS,
    STATES,
    cm_ranks,
    cut_cms,
    enrich_acks,
    judging_acks,
)
from spark_audit.transforms.facts import cm_facts
from spark_audit.transforms.judge import judge


def python_cases(cms_cut: DataFrame, plans: PlanSet) -> DataFrame:
    """The decided CMs in the window whose condition ``evaluate`` judges."""
    chosen = plans.frame.where(F.col("valid") & ~F.col("native")).select(
        "plan_id", "condition_json"
    )
    return (
        cms_cut.where(
            F.col("in_window")
            & F.col("state_code").isin(STATES.index("satisfied"), STATES.index("violated"))
            & F.col("effective_at").isNotNull()
            & F.col("decided_at").isNotNull()
        )
        .join(F.broadcast(chosen) if plans.small else chosen, "plan_id")
        .select(
            "cm_key",
            "cm_rank",
            "cm_id",
            "condition_json",
            "sent_at",
            F.col("effective_at").alias("at"),
        )
    )


def judge_cut(
    cms_cut: DataFrame,
    enriched: DataFrame,
    plans: PlanSet,
    *,
    until: datetime | None,
    stale_grace: timedelta,
) -> DataFrame:
    """:func:`spark_audit.transforms.judge.judge` of the cut's CMs over their enriched
    acks, with ``evaluate``'s verdicts (:func:`python_cases`) where the plans need it
    (``enriched`` then needs its text columns)."""
    python = None
    if plans.python:
        cases = python_cases(cms_cut, plans)
        python = python_verdicts(cases, judging_acks(enriched)).join(
            cases.select("cm_id", "cm_key", "cm_rank"), "cm_id"
        )
    return judge(
        cm_facts(cms_cut, enriched, plans),
        plans,
        python=python,
        until=until,
        stale_grace=stale_grace,
    )


def recompute(cases: DataFrame, acks: DataFrame, *, native: bool = True) -> DataFrame:
    """``cm_id, verdict, path, error`` for ``cases`` (``cm_id, condition_json, sent_at,
    at``) judged at their ``at`` over every ack in ``acks`` (store layout).

    ``native=False`` sends every case through ``condmsg.evaluate`` (tests compare both).
    """
    spark = cases.sparkSession
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or "8")
    plans = plan_set(cases, native=native)
    cms = cases.select(
        "cm_id",
        "condition_json",
        "sent_at",
        F.lit(None).cast("string").alias("sender"),
        F.lit("satisfied").alias("state"),
        F.col("at").alias("decided_at"),
        F.col("at").alias("effective_at"),
        F.col("at").alias("evaluation_deadline"),
    )
    cut = cut_cms(cms, plans, None, partitions)
    ranks = cm_ranks(cut)
    if ranks is not None:
        cut = cut_cms(cms, plans, None, partitions, ranks)
    none = local_frame(spark, [], SCHEMAS["compensations"])
    enriched = enrich_acks(acks.withColumn("status", F.lit(COUNTED_STATUS)), none, cut, plans, None)
    judged = judge_cut(cut, enriched, plans, until=None, stale_grace=timedelta(0))
    ids = cut.select("cm_key", "cm_rank", "cm_id")
    return judged.join(ids, ["cm_key", "cm_rank"]).select(
        "cm_id", F.col("recomputed_verdict").alias("verdict"), "path", "error"
    )
