"""Outcome, compensation and deadline-miss rates (by sender, condition shape, destination,
and over time), the per-CM totals, and the CMs the per-CM detail tables list.

One aggregation over the judged CMs (:func:`spark_audit.transforms.judge.judge`), grouped
by plan, sender and ``sent_at`` bucket, gives partial counts that the driver folds into
every table: per shape (a plan's), per sender, per bucket, per destination (a plan's slot
``i`` is the destination ``leaf_names[i]``) and overall. A CM that a detail table lists (a
*candidate*: disagreeing verdict, late acks, multiple consumption, stale, invalid
condition) is its own group, keyed by its numeric identity ``(cm_key, cm_rank)``, so the
same pass returns its row (the caller looks its ``cm_id`` up). Senders are grouped by
their ``sender_code`` (:meth:`spark_audit.transforms.conditions.PlanSet.sender_codes`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.transforms.conditions import PlanSet
from spark_audit.transforms.judge import discrepant, with_late_acks

OUTCOMES = ("satisfied", "violated", "pending")
#: The per-CM counts summed into ``overall`` by :func:`fold`.
CM_COUNTS = (
    "cms",
    *OUTCOMES,
    "compensated",
    "decided",
    "native_cms",
    "discrepancies",
    "late_ack_effects",
    "multiple_consumptions",
    "stale_pending",
    "invalid_conditions",
)
#: Per-destination counts (per slot in :func:`rollup_frame`).
DESTINATION_COUNTS = (
    "pickup_deadlines",
    "pickup_misses",
    "process_deadlines",
    "process_misses",
    "compensated",
)
#: The columns of a candidate CM's row.
CANDIDATE_COLUMNS = (
    "sent_at",
    "state",
    "decided_at",
    "effective_at",
    "evaluation_deadline",
    "decided",
    "valid",
    "agrees",
    "recomputed_verdict",
    "path",
    "error",
    "late_acks",
    "flagged",
    "verdict_with_late",
    "multi",
    "stale",
)


def _count(condition: Column) -> Column:
    return F.count(F.when(condition, 1))


def candidate() -> Column:
    """A CM one of the per-CM detail tables lists (or whose acks the ack tables need)."""
    return discrepant() | with_late_acks() | F.col("stale") | ~F.col("valid") | (F.col("multi") > 0)


def rollup_frame(judged: DataFrame, plans: PlanSet, bucket_seconds: int) -> DataFrame:
    """Partial counts per (plan, sender code, ``sent_at`` bucket, candidate CM), and
    ``collided``: rows of the judged CMs that stand for several CMs (``n_cm > 1``, see
    :func:`spark_audit.transforms.facts.cm_facts`)."""
    seconds = F.unix_seconds("sent_at")
    bucket = F.timestamp_seconds(F.floor(seconds / bucket_seconds) * bucket_seconds)
    state, decided, late = F.col("state"), F.col("decided"), with_late_acks()
    per_slot: list[Column] = []
    for i in range(plans.slots):
        pickup, process, comp = F.col(f"d_pm{i}"), F.col(f"d_cm{i}"), F.col(f"d_comp{i}")
        per_slot += [
            F.count(pickup).alias(f"pickup_deadlines{i}"),
            _count(pickup).alias(f"pickup_misses{i}"),
            F.count(process).alias(f"process_deadlines{i}"),
            _count(process).alias(f"process_misses{i}"),
            _count(comp).alias(f"compensated{i}"),
        ]
    # A candidate's own columns are grouping keys (null for every other CM), so the
    # aggregation keeps fixed-width buffers (a hash aggregation, not a sort).
    judged = judged.withColumn("_candidate", candidate())
    chosen = F.col("_candidate")
    grouped = judged.groupBy(
        "plan_id",
        "sender_code",
        bucket.alias("bucket_start"),
        F.when(chosen, F.col("cm_key")).alias("cm_key"),
        F.when(chosen, F.col("cm_rank")).alias("cm_rank"),
        *(F.when(chosen, F.col(name)).alias(f"cm_{name}") for name in CANDIDATE_COLUMNS),
    ).agg(
        F.count(F.lit(1)).alias("cms"),
        *(_count(state == outcome).alias(outcome) for outcome in OUTCOMES),
        _count(F.col("compensated")).alias("compensated"),
        _count(decided).alias("decided"),
        _count(F.col("path") == "native").alias("native_cms"),
        _count(discrepant()).alias("discrepancies"),
        _count(late).alias("late_ack_effects"),
        F.sum("multi").alias("multiple_consumptions"),
        _count(F.col("stale")).alias("stale_pending"),
        _count(~F.col("valid")).alias("invalid_conditions"),
        _count(F.col("n_cm") > 1).alias("collided"),
        *per_slot,
    )
    details = plans.frame.select("plan_id", "shape", "leaf_names", "condition_json")
    return grouped.join(F.broadcast(details) if plans.small else details, "plan_id", "left")


def _ratio(part: float | int | None, whole: float | int | None) -> float | None:
    return part / whole if part is not None and whole else None


def _with_rates(row: dict[str, Any]) -> dict[str, Any]:
    decided = row["satisfied"] + row["violated"]
    return {
        **row,
        "success_rate": _ratio(row["satisfied"], decided),
        "failure_rate": _ratio(row["violated"], decided),
        "compensation_rate": _ratio(row["compensated"], decided),
    }


def _add(into: dict[str, int], row: Mapping[str, Any], keys: Iterable[str]) -> None:
    for key in keys:
        into[key] = into.get(key, 0) + int(row[key] or 0)


def fold(rows: Iterable[Mapping[str, Any]], senders: Sequence[str] = ()) -> dict[str, Any]:
    """The collected :func:`rollup_frame` as tables: ``rates_by_sender``,
    ``rates_by_shape``, ``outcomes_over_time``, ``destinations`` (row lists), ``overall``
    (:data:`CM_COUNTS` over every CM), ``candidates`` (one dict per candidate CM, with its
    ``cm_key, cm_rank``) and ``collided`` (see :func:`rollup_frame`). ``senders``: the
    names of the sender codes."""
    outcome_keys = ("cms", *OUTCOMES, "compensated")
    by_sender: dict[Any, dict[str, int]] = defaultdict(dict)
    shapes: dict[Any, dict[str, int]] = defaultdict(dict)
    buckets: dict[Any, dict[str, int]] = defaultdict(dict)
    destinations: dict[str, dict[str, int]] = defaultdict(dict)
    overall: dict[str, int] = {}
    candidates = []
    collided = 0
    for row in rows:
        code = row["sender_code"]
        sender = senders[code] if code is not None else None
        collided += int(row["collided"] or 0)
        _add(by_sender[sender], row, outcome_keys)
        _add(shapes[row["shape"]], row, outcome_keys)
        _add(buckets[row["bucket_start"]], row, OUTCOMES)
        _add(overall, row, CM_COUNTS)
        for i, name in enumerate(row["leaf_names"] or ()):
            into = destinations[name]
            _add(into, row, ("cms", *OUTCOMES))
            for key in DESTINATION_COUNTS:
                into[key] = into.get(key, 0) + int(row.get(f"{key}{i}") or 0)
        if row["cm_key"] is not None:
            candidates.append(
                {
                    "cm_key": row["cm_key"],
                    "cm_rank": row["cm_rank"],
                    "sender": sender,
                    "shape": row["shape"],
                    "condition_json": row["condition_json"],
                    **{name: row[f"cm_{name}"] for name in CANDIDATE_COLUMNS},
                }
            )
    return {
        "rates_by_sender": [
            _with_rates({"sender": k, **v}) for k, v in sorted(by_sender.items(), key=_by_key)
        ],
        "rates_by_shape": [
            _with_rates({"shape": k, **v}) for k, v in sorted(shapes.items(), key=_by_key)
        ],
        "outcomes_over_time": [{"bucket_start": k, **v} for k, v in sorted(buckets.items())],
        "destinations": [_destination(k, v) for k, v in sorted(destinations.items())],
        "overall": overall,
        "candidates": candidates,
        "collided": collided,
    }


def _by_key(item: tuple[Any, Any]) -> str:
    return "" if item[0] is None else str(item[0])


def _destination(name: str, counts: Mapping[str, int]) -> dict[str, Any]:
    row = _with_rates(
        {
            "destination": name,
            "copies": counts["cms"],
            **{k: counts[k] for k in OUTCOMES},
            "compensated": counts["compensated"],
        }
    )
    return {
        **row,
        **{k: counts[k] for k in DESTINATION_COUNTS if k != "compensated"},
        "pickup_miss_rate": _ratio(counts["pickup_misses"], counts["pickup_deadlines"]),
        "process_miss_rate": _ratio(counts["process_misses"], counts["process_deadlines"]),
    }


def bucket_seconds_for(span_seconds: float, buckets: int = 48) -> int:
    """A round bucket width giving at most about ``buckets`` buckets over the span."""
    for width in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 6 * 3600, 86400, 7 * 86400):
        if span_seconds / width <= buckets:
            return width
    return 30 * 86400
