"""``condmsg.evaluate`` as native Spark expressions, for single-queue and flat-set conditions.

Three-valued logic is encoded as integers: TRUE = 1, UNKNOWN = 0, FALSE = -1, so Kleene's
AND is ``least`` / ``min`` (nulls, i.e. absent constraints, are ignored by both). Instants
are compared as integer microseconds since the epoch (``unix_micros``), the resolution of
``condmsg`` datetimes, so a deadline is inclusive exactly as in ``evaluate``.

For one consumption of a queue copy (DESIGN section 5), with ``n`` matching acks,
``first_read`` and ``first_commit`` (over COMMIT acks), a deadline ``D``, the instant
``now`` and ``final = now >= sent_at + evaluation window``:

* picked up by D: TRUE if ``first_read <= D``; else FALSE if ``n > 0`` or ``final``; else
  UNKNOWN;
* processed by D: TRUE if ``first_commit <= D``; else FALSE if ``n > 0`` or ``now > D`` or
  ``final``; else UNKNOWN.

A member's own constraints use its own deadlines; the set's constraint of each kind uses
every member's fact at the set's deadline, combined by the count rule when the set has
``min_``/``max_`` for that kind, else by AND. The verdict is the AND of everything.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

TRUE, UNKNOWN, FALSE = 1, 0, -1

#: Columns a case frame must have (plus the plan columns of PLAN_SCHEMA).
CASE_COLUMNS = ("cm_id", "sent_at", "at")
#: The set-level rule columns, carried through the aggregations (constant per CM).
_RULES = (
    "set_pickup_ms",
    "set_process_ms",
    "min_pickup",
    "max_pickup",
    "min_process",
    "max_process",
)


def _deadline(ms_column: str) -> Column:
    return F.col("sent_us") + F.col(ms_column) * F.lit(1000)


def _pickup(deadline: Column) -> Column:
    return (
        F.when(F.col("first_read_us") <= deadline, F.lit(TRUE))
        .when((F.col("n_acks") > 0) | F.col("final"), F.lit(FALSE))
        .otherwise(F.lit(UNKNOWN))
    )


def _process(deadline: Column) -> Column:
    return (
        F.when(F.col("first_commit_us") <= deadline, F.lit(TRUE))
        .when((F.col("n_acks") > 0) | (F.col("at_us") > deadline) | F.col("final"), F.lit(FALSE))
        .otherwise(F.lit(UNKNOWN))
    )


def _if_set(ms_column: str, value: Column) -> Column:
    return F.when(F.col(ms_column).isNotNull(), value)


def _count_rule(held: Column, unknown: Column, low: Column, high: Column) -> Column:
    low_part = (
        F.when(held >= low, F.lit(TRUE))
        .when(held + unknown < low, F.lit(FALSE))
        .otherwise(F.lit(UNKNOWN))
    )
    high_part = (
        F.when(held > high, F.lit(FALSE))
        .when(held + unknown <= high, F.lit(TRUE))
        .otherwise(F.lit(UNKNOWN))
    )
    # least() skips nulls: an absent bound contributes nothing.
    return F.least(F.when(low.isNotNull(), low_part), F.when(high.isNotNull(), high_part))


def _set_constraint(kind: str) -> Column:
    ms, low, high = f"set_{kind}_ms", F.col(f"min_{kind}"), F.col(f"max_{kind}")
    counted = _count_rule(F.col(f"held_{kind}"), F.col(f"unknown_{kind}"), low, high)
    value = F.when(low.isNotNull() | high.isNotNull(), counted).otherwise(F.col(f"all_{kind}"))
    return F.when(F.col(ms).isNotNull(), value)


def verdict_name(value: Column) -> Column:
    return (
        F.when(value == TRUE, F.lit("satisfied"))
        .when(value == FALSE, F.lit("violated"))
        .when(value == UNKNOWN, F.lit("pending"))
    )


def native_verdicts(cases: DataFrame, acks: DataFrame) -> DataFrame:
    """``cm_id, verdict`` for native ``cases`` (plan columns + ``sent_at``, ``at``).

    ``acks`` holds the acks to judge by (``cm_id, destination, recipient, kind, read_at,
    committed_at``); the caller has already chosen them (e.g. status ``counted``).
    """
    members = cases.select(
        "cm_id",
        F.unix_micros("sent_at").alias("sent_us"),
        F.unix_micros("at").alias("at_us"),
        (
            F.unix_micros("at") >= F.unix_micros("sent_at") + F.col("eval_window_ms") * F.lit(1000)
        ).alias("final"),
        F.posexplode("members").alias("pos", "m"),
        *_RULES,
    ).select(
        "cm_id",
        "sent_us",
        "at_us",
        "final",
        "pos",
        F.col("m.name").alias("destination"),
        F.col("m.recipient").alias("member_recipient"),
        F.col("m.own_pickup_ms").alias("own_pickup_ms"),
        F.col("m.own_process_ms").alias("own_process_ms"),
        *_RULES,
    )
    evidence = acks.select(
        "cm_id",
        "destination",
        F.col("recipient").alias("ack_recipient"),
        F.unix_micros("read_at").alias("read_us"),
        F.when(F.col("kind") == "commit", F.unix_micros("committed_at")).alias("commit_us"),
    )
    joined = members.join(evidence, ["cm_id", "destination"], "left")
    matched = F.col("read_us").isNotNull() & (
        F.col("member_recipient").isNull() | (F.col("ack_recipient") == F.col("member_recipient"))
    )
    facts = joined.groupBy(
        "cm_id",
        "pos",
        "sent_us",
        "at_us",
        "final",
        "own_pickup_ms",
        "own_process_ms",
        *_RULES,
    ).agg(
        F.count(F.when(matched, 1)).alias("n_acks"),
        F.min(F.when(matched, F.col("read_us"))).alias("first_read_us"),
        F.min(F.when(matched, F.col("commit_us"))).alias("first_commit_us"),
    )
    judged = facts.select(
        "cm_id",
        F.least(
            _if_set("own_pickup_ms", _pickup(_deadline("own_pickup_ms"))),
            _if_set("own_process_ms", _process(_deadline("own_process_ms"))),
        ).alias("own"),
        _if_set("set_pickup_ms", _pickup(_deadline("set_pickup_ms"))).alias("set_pickup"),
        _if_set("set_process_ms", _process(_deadline("set_process_ms"))).alias("set_process"),
        *_RULES,
    )
    per_cm = judged.groupBy("cm_id").agg(
        F.min("own").alias("own"),
        F.min("set_pickup").alias("all_pickup"),
        F.sum((F.col("set_pickup") == TRUE).cast("long")).alias("held_pickup"),
        F.sum((F.col("set_pickup") == UNKNOWN).cast("long")).alias("unknown_pickup"),
        F.min("set_process").alias("all_process"),
        F.sum((F.col("set_process") == TRUE).cast("long")).alias("held_process"),
        F.sum((F.col("set_process") == UNKNOWN).cast("long")).alias("unknown_process"),
        *(F.first(name).alias(name) for name in _RULES),
    )
    combined = per_cm.select(
        "cm_id",
        F.least(F.col("own"), _set_constraint("pickup"), _set_constraint("process")).alias("value"),
    )
    return combined.select("cm_id", verdict_name(F.col("value")).alias("verdict"))
