"""The detail tables: the CMs and acks behind the audit's anomalies, with their evidence.

The per-CM tables come from the candidate CMs the per-CM job collected (on the driver);
the ack-level ones from the *candidate acks* (see :mod:`spark_audit.transforms.anomalies`):
the acks of the flagged CMs and every ack a table lists, read again for their few CMs
(found by ``cm_key`` in the cached acks) and, when they are few, collected once. Beside
them, in a second thread, the discrepancies' stored reasons are read from the source;
then one query over the candidate acks collects every table small enough for the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_audit import output
from spark_audit.alongside import run_alongside
from spark_audit.output import CM_SCHEMAS, DISCREPANCY_SCHEMA, SMALL_SCHEMAS, TableWriter
from spark_audit.readers import AuditInput, Window, seen_in
from spark_audit.reevaluate.fallback import judge_rows, python_verdicts
from spark_audit.schemas import local_frame
from spark_audit.settings import one_shuffle_partition
from spark_audit.transforms import anomalies, enrich
from spark_audit.transforms.conditions import PlanSet
from spark_audit.transforms.enrich import enrich_acks

#: At most this many discrepancies are explained with ``evaluate`` on the driver.
DRIVER_EXPLAIN = 10_000
_FLAGGED = T.StructType(
    [
        T.StructField("cm_id", T.StringType()),
        *(T.StructField(name, T.BooleanType()) for name in ("discrepant", "multi", "late")),
    ]
)
_IDS = T.StructType([T.StructField("cm_id", T.StringType())])


@dataclass(frozen=True, slots=True)
class AuditFrames:
    """The plans and the cached frames (:func:`cut_cms`, :func:`enrich_acks`)."""

    plans: PlanSet
    cms: DataFrame
    acks: DataFrame


def write_detail_tables(
    spark: SparkSession,
    data: AuditInput,
    window: Window,
    frames: AuditFrames,
    candidates: list[dict[str, Any]],
    overall: Mapping[str, int],
    ack_counts: Mapping[str, int],
    writer: TableWriter,
) -> dict[str, int]:
    """Every detail table: the per-CM ones from the candidate CMs (on the driver), the
    ack-level ones from the candidate acks (see :mod:`spark_audit.transforms.anomalies`).
    Returns the late-ack metrics (judged here: see ``verdict_with_late`` in
    :func:`spark_audit.transforms.judge.judge`)."""
    stale = [c for c in candidates if c["stale"]]
    writer.rows("stale_pending", stale, CM_SCHEMAS["stale_pending"])
    invalid = [c for c in candidates if not c["valid"]]
    writer.rows("invalid_conditions", invalid, CM_SCHEMAS["invalid_conditions"])
    wrong = [c for c in candidates if c["decided"] and not c["agrees"]]
    late = [c for c in candidates if c["decided"] and c["late_acks"]]
    flagged, flagged_cms = _flagged_cms(spark, candidates, wrong, late)
    expected = sum(
        ack_counts[k] for k in ("late_acks", "malformed_acks", "orphan_rows", *anomalies.PROBLEMS)
    )
    small = expected <= output.DRIVER_ROWS
    # The candidate acks (the listed ones and those of the flagged CMs): collected when
    # few (DRIVER_ROWS listed ones, the acks of at most DRIVER_EXPLAIN flagged CMs);
    # cached when only the listed ones are few; else read again by each query.
    cached: DataFrame | None = None
    try:
        # The stored reasons of the discrepancies are read from the source in a second
        # thread: a scan of the CMs whose few tasks fill the cores the acks' scan leaves.
        with run_alongside(spark, lambda: _stored_reasons(data, wrong)) as reading:
            rows = candidate_acks(data, window, frames, flagged, small=small)
            if small and flagged_cms <= DRIVER_EXPLAIN:
                rows = _collected(rows)
            elif small:
                rows = cached = rows.persist(StorageLevel.MEMORY_AND_DISK)
            late_metrics = _late_effects(late, rows, writer)
            anomaly_frame = data.anomalies.where(seen_in(window, "recorded_at"))
            # The reasons' query has no shuffle for this to change.
            with one_shuffle_partition(spark):
                kinds = dict(anomalies.anomaly_counts(anomaly_frame))
            reasons = reading.result()
        writer.rows(
            "anomaly_counts",
            [{"kind": k, "count": v} for k, v in sorted(kinds.items())],
            SMALL_SCHEMAS["anomaly_counts"],
        )
        _discrepancies(wrong, reasons, rows, writer)
        writer.frames(_ack_tables(rows, anomaly_frame, kinds, overall, ack_counts))
    finally:
        if cached is not None:
            cached.unpersist()
    return late_metrics


def _flagged_cms(
    spark: SparkSession,
    candidates: list[dict[str, Any]],
    wrong: list[dict[str, Any]],
    late: list[dict[str, Any]],
) -> tuple[DataFrame, int]:
    """The candidate CMs whose acks the ack-level tables need (discrepant, consumed more
    than once or with late acks), each with those flags, and how many there are."""
    wrong_ids, late_ids = {c["cm_id"] for c in wrong}, {c["cm_id"] for c in late}
    flags = [
        {
            "cm_id": c["cm_id"],
            "discrepant": c["cm_id"] in wrong_ids,
            "multi": c["multi"] > 0,
            "late": c["cm_id"] in late_ids,
        }
        for c in candidates
        if c["cm_id"] in wrong_ids or c["multi"] > 0 or c["cm_id"] in late_ids
    ]
    return local_frame(spark, flags, _FLAGGED), len(flags)


def _ack_tables(
    rows: DataFrame,
    anomaly_frame: DataFrame,
    kinds: Mapping[str, int],
    overall: Mapping[str, int],
    ack_counts: Mapping[str, int],
) -> dict[str, tuple[DataFrame, int]]:
    """The ack-level tables over the candidate acks ``rows``, each with an upper bound of
    its rows (for :meth:`TableWriter.frames`)."""
    orphans = ack_counts["orphan_rows"] + kinds.get("unknown_cm", 0)
    mismatches = sum(ack_counts[p] for p in anomalies.PROBLEMS)
    return {
        "late_acks": (anomalies.late_acks(rows), ack_counts["late_acks"]),
        "orphan_acks": (anomalies.orphan_acks(rows, anomaly_frame), orphans),
        "duplicate_acks": (anomalies.duplicate_acks(anomaly_frame), kinds.get("duplicate", 0)),
        "multiple_consumptions": (
            anomalies.multiple_consumptions(rows),
            overall.get("multiple_consumptions", 0),
        ),
        "status_mismatches": (anomalies.status_mismatches(rows), mismatches),
        "malformed_acks": (anomalies.malformed_acks(rows), ack_counts["malformed_acks"]),
    }


def candidate_acks(
    data: AuditInput, window: Window, frames: AuditFrames, flagged: DataFrame, *, small: bool
) -> DataFrame:
    """:func:`spark_audit.transforms.anomalies.ack_candidates`: from the cached acks if
    they carry their text, else from the acks read again for the few CMs whose acks the
    tables need (those of the flagged CMs and of every listed ack, found by ``cm_key``
    in the cached acks), enriched as the cached ones were: the same rows, each with its
    text. ``small``: few enough listed acks to broadcast their keys."""
    if "ack_id" in frames.acks.columns:
        return anomalies.ack_candidates(frames.acks, flagged)
    keys = (
        anomalies.listed_keys(frames.acks)
        .unionByName(flagged.select(enrich.cm_key()))
        .select(F.col("cm_key").alias("_key"))
    )
    if small:
        keys = F.broadcast(keys)
    on = F.col("cm_key") == F.col("_key")
    source = data.acks.select("*", enrich.cm_key()).join(keys, on, "left_semi").drop("cm_key")
    cms = frames.cms.join(keys, on, "left_semi")
    none = data.compensations.where(F.lit(False))
    text = enrich_acks(source, none, cms, frames.plans, window, text=True)
    return anomalies.ack_candidates(text, flagged)


def _collected(frame: DataFrame) -> DataFrame:
    """``frame`` computed once and held by the driver, as a frame of its rows.

    For the candidate acks (few: see :func:`write_detail_tables`): every detail table is
    then a query of driver-side rows, planned without the cached frames' lineage and run
    without touching the caches."""
    return frame.sparkSession.createDataFrame(frame.toArrow(), frame.schema)


def _acks_by_cm(frame: DataFrame) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for ack in frame.toArrow().to_pylist():
        found.setdefault(ack["cm_id"], []).append(ack)
    return found


def _judged_with_acks(
    cases: list[dict[str, Any]], acks: DataFrame, *, counted: dict[str, int] | None = None
) -> dict[str, dict[str, Any]]:
    """:func:`spark_audit.reevaluate.fallback.judge_row` of each case (``cm_id,
    condition_json, sent_at, at``) over its ``acks``: on the driver when they are few,
    else on the executors. ``counted``: filled with each CM's number of counted acks."""
    if len(cases) <= DRIVER_EXPLAIN:
        by_cm = _acks_by_cm(acks)
        if counted is not None:
            counted.update(
                {cm: sum(bool(a["counted"]) for a in found) for cm, found in by_cm.items()}
            )
        rows = judge_rows({**c, "acks": by_cm.get(c["cm_id"], [])} for c in cases)
    else:
        if counted is not None:
            found = acks.where("counted").groupBy("cm_id").count().collect()
            counted.update({r["cm_id"]: int(r["count"]) for r in found})
        frame = acks.sparkSession.createDataFrame(
            [(c["cm_id"], c["condition_json"], c["sent_at"], c["at"]) for c in cases],
            "cm_id string, condition_json string, sent_at timestamp, at timestamp",
        )
        rows = python_verdicts(frame, acks).toArrow().to_pylist()
    return {row["cm_id"]: row for row in rows}


def _late_effects(
    late: list[dict[str, Any]], rows: DataFrame, writer: TableWriter
) -> dict[str, int]:
    """The ``late_ack_effects`` table: each decided CM with late acks judged again with
    every ack (where the compiled path judged it; ``evaluate`` already did for the rest)."""
    missing = [{**c, "at": c["effective_at"]} for c in late if c["verdict_with_late"] is None]
    if missing:
        judged = _judged_with_acks(missing, anomalies.flagged_acks(rows, "late"))
        for case in late:
            if case["verdict_with_late"] is None and case["cm_id"] in judged:
                case["verdict_with_late"] = judged[case["cm_id"]]["py_verdict_all"]
    effects = []
    for c in late:
        changes = (
            c["verdict_with_late"] is not None and c["verdict_with_late"] != c["recomputed_verdict"]
        )
        effects.append(
            {
                **c,
                "stored_verdict": c["state"],
                "verdict_counted": c["recomputed_verdict"],
                "changes_verdict": changes,
            }
        )
    writer.rows("late_ack_effects", effects, CM_SCHEMAS["late_ack_effects"])
    return {
        "late_acks_changing_verdict": sum(e["changes_verdict"] for e in effects),
        "late_ack_flag_mismatches": sum(e["changes_verdict"] != e["flagged"] for e in effects),
    }


def _stored_reasons(data: AuditInput, wrong: list[dict[str, Any]]) -> dict[str, str | None]:
    """``reasons_json`` of the ``wrong`` CMs, as the source stores it (by ``cm_id``)."""
    if not wrong:
        return {}
    ids = local_frame(data.cms.sparkSession, [{"cm_id": c["cm_id"]} for c in wrong], _IDS)
    stored = data.cms.join(F.broadcast(ids), "cm_id", "left_semi").select("cm_id", "reasons_json")
    return {r["cm_id"]: r["reasons_json"] for r in stored.toArrow().to_pylist()}


def _discrepancies(
    wrong: list[dict[str, Any]],
    reasons: Mapping[str, str | None],
    rows: DataFrame,
    writer: TableWriter,
) -> None:
    """The disagreeing CMs with evidence: ``evaluate``'s verdict and reasons over their
    counted acks, and the evaluator's stored reasons (``reasons``: by ``cm_id``)."""
    if not wrong:
        writer.arrow("discrepancies", DISCREPANCY_SCHEMA.empty_table())
        return
    evidence = anomalies.flagged_acks(rows, "discrepant").where("counted")
    cases = [{**c, "at": c["effective_at"]} for c in wrong]
    counted: dict[str, int] = {}
    explained = _judged_with_acks(cases, evidence, counted=counted)
    table = []
    for case in cases:
        found = explained.get(case["cm_id"], {})
        table.append(
            {
                **case,
                "stored_verdict": case["state"],
                "python_verdict": found.get("py_verdict"),
                "counted_acks": counted.get(case["cm_id"], 0),
                "reasons": found.get("py_reasons") or [],
                "stored_reasons_json": reasons.get(case["cm_id"]),
                "error": case["error"] or found.get("py_error"),
            }
        )
    writer.arrow("discrepancies", pa.Table.from_pylist(table, schema=DISCREPANCY_SCHEMA))
