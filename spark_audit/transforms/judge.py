"""Every CM in the window judged: its recomputed verdict, its anomalies and its
per-destination deadline misses and compensations, from its facts
(:func:`spark_audit.transforms.facts.cm_facts`).

The verdict is the compiled one (:mod:`spark_audit.reevaluate.compiled`) where the CM's
condition compiles, else ``evaluate``'s (:mod:`spark_audit.reevaluate.fallback`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.reevaluate import VERDICTS
from spark_audit.reevaluate.compiled import COUNTED, compiled_values, verdict_name
from spark_audit.transforms.conditions import NODE_ARRAYS, PlanSet
from spark_audit.transforms.enrich import unix_us
from spark_audit.transforms.facts import MASKS, slot_bit

#: The plan columns :func:`judge` reads.
_PLAN_COLUMNS = (
    "valid",
    "native",
    "skel_id",
    "error",
    "eval_window_ms",
    "leaf_names",
    "leaf_pickup_ms",
    "leaf_process_ms",
    *NODE_ARRAYS,
)
#: ``evaluate``'s columns, null where it judges no CM.
_PYTHON_COLUMNS = (
    ("py_verdict", "string"),
    ("py_verdict_all", "string"),
    ("py_reasons", "array<string>"),
    ("py_error", "string"),
)
#: Whether a CM's deadlines are final (its evaluation deadline passed by ``until``).
_FINAL = "_final_deadline"


def decided_case() -> Column:
    """A CM with a stored decision (the cases the re-evaluation judges)."""
    return (
        F.col("state").isin(*VERDICTS)
        & F.col("effective_at").isNotNull()
        & F.col("decided_at").isNotNull()
    )


def discrepant() -> Column:
    """A decided CM whose recomputed verdict differs from the stored one."""
    return F.col("decided") & ~F.col("agrees")


def with_late_acks() -> Column:
    """A decided CM with well-formed acks that were not counted."""
    return F.col("decided") & (F.col("late_acks") > 0)


def judge(
    facts: DataFrame,
    plans: PlanSet,
    *,
    python: DataFrame | None,
    until: datetime | None,
    stale_grace: timedelta,
) -> DataFrame:
    """Every CM in the window (:func:`spark_audit.transforms.facts.cm_facts`) with its
    verdicts, anomalies and destination facts.

    ``python``: ``cm_key, cm_rank, py_verdict, py_verdict_all, py_reasons, py_error`` of the CMs
    that ``evaluate`` judges (:func:`spark_audit.reevaluate.fallback.python_verdicts`).
    ``verdict_with_late``: with late acks, the verdict over every ack where ``evaluate``
    judged the CM (else null: the driver judges those few CMs, see
    :func:`spark_audit.details.write_detail_tables`). Per slot ``i`` (the plan's destination
    ``leaf_names[i]``): ``d_pm{i}``/``d_cm{i}`` pickup/processing deadline missed (null
    unless the CM's evaluation deadline passed by ``until``), ``d_comp{i}`` compensation
    released to it (null past the plan's slots).
    """
    valued = _valued(_with_plans(facts, plans, python), plans)
    valued = valued.withColumn(
        _FINAL,
        F.col("evaluation_deadline") <= F.lit(until) if until is not None else F.lit(True),
    )
    decided = F.col("decided")
    return valued.select(
        "cm_key",
        "cm_rank",
        "n_cm",
        "sender_code",
        "sent_at",
        "plan_id",
        "state",
        "decided_at",
        "effective_at",
        "evaluation_deadline",
        decided.alias("decided"),
        F.col("_valid").alias("valid"),
        _recomputed().alias("recomputed_verdict"),
        _path().alias("path"),
        _error().alias("error"),
        F.col("_late").alias("late_acks"),
        (F.coalesce(F.col("flag"), F.lit(0)) == 1).alias("flagged"),
        _with_late().alias("verdict_with_late"),
        F.coalesce(F.col("multi"), F.lit(0)).alias("multi"),
        (F.coalesce(F.col("compensated"), F.lit(0)) == 1).alias("compensated"),
        _stale(until, stale_grace).alias("stale"),
        *_deadline_columns(plans),
    ).withColumn("agrees", F.coalesce(F.col("recomputed_verdict") == F.col("state"), F.lit(False)))


def _with_plans(facts: DataFrame, plans: PlanSet, python: DataFrame | None) -> DataFrame:
    """``facts`` with ``evaluate``'s verdicts (null columns without ``python``) and their
    plans' columns."""
    joined = facts if python is None else facts.join(python, ["cm_key", "cm_rank"], "left")
    joined = joined.join(plans.lookup(*_PLAN_COLUMNS), "plan_id", "left")
    if python is None:
        joined = joined.select(
            "*", *(F.lit(None).cast(kind).alias(name) for name, kind in _PYTHON_COLUMNS)
        )
    return joined


def _valued(joined: DataFrame, plans: PlanSet) -> DataFrame:
    """The CMs with ``decided``, ``_valid``, ``_native`` and the compiled verdict
    ``_value`` of the decided native ones (its stages, :func:`compiled_values`)."""
    at_us = unix_us("effective_at")
    valid = F.coalesce(F.col("valid"), F.lit(False))
    native = valid & F.coalesce(F.col("native"), F.lit(False))
    staged = joined.select(
        "*",
        at_us.alias("at_us"),
        (at_us >= F.col("sent_us") + F.col("eval_window_ms") * F.lit(1000)).alias("final"),
        F.coalesce(decided_case(), F.lit(False)).alias("decided"),
        valid.alias("_valid"),
        native.alias("_native"),
    )
    compiled = compiled_values(plans.skeletons)
    for stage in compiled.stages:
        staged = staged.selectExpr("*", *stage)
    value = compiled.values[COUNTED.variant]
    return staged.selectExpr("*", f"CASE WHEN decided AND _native THEN {value} END AS _value")


def _recomputed() -> Column:
    """The verdict over the counted acks: compiled, or ``evaluate``'s (null for a CM not
    decided or with an invalid condition)."""
    return (
        F.when(~F.col("decided") | ~F.col("_valid"), F.lit(None))
        .when(F.col("_native"), F.expr(verdict_name("_value")))
        .otherwise(F.col("py_verdict"))
    )


def _with_late() -> Column:
    """With late acks, the verdict over every ack: ``evaluate``'s for the CMs it judges;
    for the compiled ones the driver fills it in (they are few, see
    :func:`spark_audit.details.write_detail_tables`)."""
    return F.when(
        F.col("decided") & F.col("_valid") & ~F.col("_native") & (F.col("_late") > 0),
        F.col("py_verdict_all"),
    )


def _path() -> Column:
    """How the CM was judged: ``invalid``, ``native`` (compiled) or ``python``."""
    return (
        F.when(~F.col("_valid"), F.lit("invalid"))
        .when(F.col("_native"), F.lit("native"))
        .otherwise(F.lit("python"))
    )


def _error() -> Column:
    """Why the condition does not decode, or ``evaluate``'s error."""
    return F.when(
        ~F.col("_valid"), F.coalesce(F.col("error"), F.lit("condition does not decode"))
    ).when(~F.col("_native"), F.col("py_error"))


def _stale(until: datetime | None, stale_grace: timedelta) -> Column:
    """A CM still pending ``stale_grace`` past its evaluation deadline, as of ``until``."""
    if until is None:
        return F.lit(False)
    limit = F.lit(until - stale_grace)
    return (F.col("state") == "pending") & (F.col("evaluation_deadline") < limit)


def _deadline_columns(plans: PlanSet) -> list[Column]:
    """Per slot, in SQL text (one parse per column): ``d_pm{i}``, ``d_cm{i}`` and
    ``d_comp{i}``; a deadline is missed only once final."""
    slots: list[Column] = []
    for i in range(plans.slots):
        present = f"_valid AND get(leaf_names, {i}) IS NOT NULL"
        slots += [
            _missed(present, i, "pickup", MASKS["on_time_pickup"]).alias(f"d_pm{i}"),
            _missed(present, i, "process", MASKS["on_time_process"]).alias(f"d_cm{i}"),
            F.expr(f"CASE WHEN {present} THEN {slot_bit(MASKS['comp'], i)} END").alias(
                f"d_comp{i}"
            ),
        ]
    return slots


def _missed(present: str, i: int, kind: str, mask: str) -> Column:
    """Slot ``i``'s ``kind`` deadline missed: null unless the slot is present, final and
    has such a deadline."""
    ms = f"get(leaf_{kind}_ms, {i})"
    on_time = slot_bit(mask, i)
    return F.expr(f"CASE WHEN {present} AND {_FINAL} AND {ms} IS NOT NULL THEN NOT {on_time} END")
