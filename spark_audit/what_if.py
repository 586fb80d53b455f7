"""What-if replay: every decided CM judged again over the same acks under changed conditions.

The facts of each CM (first read and commit per destination, recipients per topic probe)
are aggregated once, as the audit aggregates them (:func:`spark_audit.transforms.facts.cm_facts`);
each *variant* (variant 0: the recorded condition; then one per change set, e.g. one per
grid value of a sweep) is a compiled verdict over those facts
(:func:`spark_audit.reevaluate.compiled.compiled_values` with the variant's tag), all in
one projection. Changes are applied on the driver once per distinct condition
(:mod:`spark_audit.changes`); a CM reaches its variants' plan arrays through one broadcast
join on its ``plan_id``. Nothing runs in Python per CM, except ``evaluate`` on the driver
for the few flipped CMs whose reasons are shown.

A CM is judged at its (changed) evaluation deadline: every fact is final, so the verdict
does not depend on when the evaluator would have decided. Over the counted acks (those the
evaluator judged) a recorded condition therefore gives the stored verdict of a consistent
store: the audit's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from condmsg.core.condition_codec import condition_from_json, condition_to_json
from condmsg.core.conditions import Condition, Kind
from condmsg.core.errors import ConditionError, ConfigError
from condmsg.core.timeutil import utcnow
from spark_audit.changes import Change, ChangeSet, Selection, parse_changes, sweep_changes
from spark_audit.plans import Plan, numbered, plan_of
from spark_audit.readers import AuditInput, Window, export_until, read_parquet, sent_in
from spark_audit.reevaluate import VERDICTS
from spark_audit.reevaluate.compiled import Facts, compiled_values, verdict_name
from spark_audit.reevaluate.fallback import evaluate_row
from spark_audit.schemas import local_frame
from spark_audit.settings import audit_settings, least_partitions
from spark_audit.transforms.conditions import NODE_ARRAYS, PlanSet, plan_set
from spark_audit.transforms.enrich import COUNTED_STATUS, cm_ranks, cut_cms, enrich_acks
from spark_audit.transforms.facts import cm_facts

_LONGS = T.ArrayType(T.LongType())
#: Flipped CMs whose reasons ``evaluate`` gives (on the driver), by default.
EXPLAINED = 200


def _tag(k: int) -> str:
    return f"_w{k}"


@dataclass(frozen=True, slots=True)
class WhatIf:
    """A what-if's outcome. ``cms``: every selected decided CM with ``cm_id, sender,
    sent_at, shape``, the stored ``state``, ``original`` (the recorded condition replayed)
    and ``replayed`` (the changed one), null where a condition is judged by neither
    (lazy); cached, as the totals and the flips read it: ``cms.unpersist()`` when done
    with it. ``totals``: ``judged``, ``unjudged``, ``flips_to_violated``,
    ``flips_to_satisfied``, ``violated_before``, ``violated_after`` and the failure
    rates. ``flips``: up to ``explain`` flipped CMs with ``evaluate``'s reasons before
    and after, and those that changed."""

    changes: str
    totals: dict[str, Any]
    cms: DataFrame
    flips: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Sweep:
    """A sweep's outcome: per grid value (``points``: ``value``, ``judged``, ``violated``,
    ``failure_rate``) and the recorded conditions' own (``baseline``)."""

    parameter: str
    points: list[dict[str, Any]]
    baseline: dict[str, Any]

    def chart(self) -> str:
        """The failure rate per value as an inline SVG bar chart."""
        from spark_audit.svg import stacked_bars

        return stacked_bars(
            f"failure rate by {self.parameter} (recorded: {_percent(self.baseline)})",
            [str(p["value"]) for p in self.points],
            {"violated (%)": [100 * (p["failure_rate"] or 0.0) for p in self.points]},
            x_title=self.parameter,
            y_title="CMs violated (%)",
        )


def _percent(row: dict[str, Any]) -> str:
    rate = row.get("failure_rate")
    return "-" if rate is None else f"{100 * rate:.1f} %"


def _window(
    spark: SparkSession, source: Any, since: datetime | None, until: datetime | None
) -> tuple[AuditInput, Window]:
    if until is None and not isinstance(source, AuditInput):
        until = export_until(spark, source)
    window = Window(until=until or utcnow(), since=since)
    if isinstance(source, AuditInput):
        return source, window
    return read_parquet(spark, str(source), window), window


def _narrowed(window: Window, selection: Selection) -> Window:
    since = max((t for t in (window.since, selection.since) if t is not None), default=None)
    until = min(t for t in (window.until, selection.until) if t is not None)
    return Window(until=until, since=since)


@dataclass(frozen=True, slots=True)
class _Variants:
    """The variants' plan arrays per recorded plan (``frame``), their compiled
    skeletons, and the probes of every variant side by side (``probes``: the width)."""

    frame: DataFrame
    skeletons: list[dict[int, Any]]
    probes: int
    errors: dict[str, str]
    #: Per variant, the kinds whose deadlines it shares with an earlier variant (its tag).
    shared: list[dict[Kind, str]]


def _variant_plans(
    spark: SparkSession, plans: PlanSet, sets: Sequence[ChangeSet], destinations: Sequence[str]
) -> _Variants:
    """Every change set applied once per distinct recorded condition (on the driver)."""
    if not plans.small:
        raise ConfigError(
            "what-if: more distinct conditions than the driver decodes "
            "(spark_audit.transforms.conditions.MAX_DRIVER_PLANS); narrow the window"
        )
    rows = plans.frame.select("plan_id", "condition_json", "valid", "leaf_names").collect()
    skeleton_ids: dict[str, int] = {}
    examples: dict[int, Any] = {}
    data: list[dict[str, Any]] = []
    width = 0
    for row in rows:
        out: dict[str, Any] = {"plan_id": row["plan_id"]}
        names = set(row["leaf_names"] or ())
        out["selected"] = not destinations or bool(names.intersection(destinations))
        original = condition_from_json(row["condition_json"]) if row["valid"] else None
        slot_of: list[int] = []
        process_of: list[bool] = []
        ms_of: list[int] = []
        for k, changes in enumerate(sets):
            plan = _changed(original, changes) if original is not None else None
            tag = _tag(k)
            out[f"_off{tag}"] = len(ms_of)
            if plan is None or not plan.native:
                out[f"skel_id{tag}"] = None
                for name in NODE_ARRAYS:
                    out[f"{name}{tag}"] = None
                continue
            skel = skeleton_ids.setdefault(plan.skeleton, len(skeleton_ids))
            examples.setdefault(skel, numbered(condition_from_json(plan.condition_json)))
            out[f"skel_id{tag}"] = skel
            as_row = plan.as_row()
            for name in NODE_ARRAYS:
                out[f"{name}{tag}"] = as_row[name]
            slot_of += as_row["probe_slot"]
            process_of += as_row["probe_process"]
            ms_of += as_row["probe_ms"]
        out["probe_slot"], out["probe_process"], out["probe_ms"] = slot_of, process_of, ms_of
        width = max(width, len(ms_of))
        data.append(out)
    fields = [
        T.StructField("plan_id", T.LongType()),
        T.StructField("selected", T.BooleanType()),
        T.StructField("probe_slot", T.ArrayType(T.IntegerType())),
        T.StructField("probe_process", T.ArrayType(T.BooleanType())),
        T.StructField("probe_ms", _LONGS),
    ]
    for k in range(len(sets)):
        tag = _tag(k)
        fields += [
            T.StructField(f"_off{tag}", T.IntegerType()),
            T.StructField(f"skel_id{tag}", T.IntegerType()),
            *(T.StructField(f"{name}{tag}", _LONGS) for name in NODE_ARRAYS),
        ]
    frame = local_frame(spark, data, T.StructType(fields))
    used = [
        {s: examples[s] for s in {r[f"skel_id{_tag(k)}"] for r in data} if s is not None}
        for k in range(len(sets))
    ]
    return _Variants(frame, used, width, {}, _shared_deadlines(data, len(sets)))


def _tuple(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)


def _shared_deadlines(data: Sequence[dict[str, Any]], count: int) -> list[dict[Kind, str]]:
    """Per variant, each kind whose deadline arrays equal an earlier variant's on every
    plan, mapped to the first such variant's tag: the deadlines a change or grid value
    leaves alone are judged once for all the variants that share them."""
    shared: list[dict[Kind, str]] = [{} for _ in range(count)]
    for kind in Kind:
        first: dict[tuple[Any, ...], str] = {}
        for k in range(count):
            arrays = tuple(_tuple(row[f"node_{kind}_ms{_tag(k)}"]) for row in data)
            shared[k][kind] = first.setdefault(arrays, _tag(k))
    return shared


def _changed(original: Condition, changes: ChangeSet) -> Plan:
    condition = changes.apply(original) if changes.changes else original
    return plan_of(condition_to_json(condition))


def _replay(
    spark: SparkSession,
    data: AuditInput,
    window: Window,
    sets: Sequence[ChangeSet],
    selection: Selection,
    partitions: int | None,
    *,
    ids: bool = True,
) -> tuple[DataFrame, PlanSet]:
    """One row per selected decided CM with ``v{k}``: its verdict under each variant
    (and its ``cm_id`` with ``ids``: a join with the CMs again)."""
    window = _narrowed(window, selection)
    least = partitions or least_partitions(spark)
    with audit_settings(spark, least):
        plans = plan_set(data.cms, chosen=sent_in(window), senders=True)
        variants = _variant_plans(spark, plans, sets, selection.destinations)
        probes = variants.frame.select("plan_id", "probe_slot", "probe_process", "probe_ms")
        wide = replace(
            plans,
            frame=plans.frame.drop("probe_slot", "probe_process", "probe_ms").join(
                probes, "plan_id"
            ),
            probes=variants.probes,
        )
        cut = cut_cms(data.cms, wide, window, least)
        ranks = cm_ranks(cut)
    if ranks is not None:
        cut = cut_cms(data.cms, wide, window, least, ranks)
    acks = enrich_acks(data.acks, data.compensations, cut, wide, window, text=False)
    facts = cm_facts(cut, acks, wide)
    decided = F.col("state").isin(*VERDICTS) & F.col("decided_at").isNotNull()
    if selection.senders:
        codes = [plans.senders.index(s) for s in selection.senders if s in plans.senders]
        decided &= F.col("sender_code").isin(codes)
    hits = ", ".join(f"c_h{j}" for j in range(variants.probes)) or "CAST(NULL AS BIGINT)"
    rows = (
        facts.where(decided)
        .join(
            F.broadcast(variants.frame.drop("probe_slot", "probe_process", "probe_ms")), "plan_id"
        )
        .where("selected")
        .selectExpr("*", f"array({hits}) AS _hits", "true AS final", "0L AS at_us")
    )
    judged = _judged(rows, variants)
    if not ids:
        return judged, plans
    return judged.join(cut.select("cm_key", "cm_rank", "cm_id"), ["cm_key", "cm_rank"]), plans


#: The columns of a judged CM besides its verdicts.
_KEEP = ("cm_key", "cm_rank", "plan_id", "sender_code", "sent_at", "state")


def _judged(rows: DataFrame, variants: _Variants) -> DataFrame:
    """``rows`` with ``v{k}``: the verdict of variant ``k`` (its compiled skeletons).

    Every variant's items of one stage are one projection (a stage's items read only
    earlier stages, see :class:`~spark_audit.reevaluate.compiled.Compiled`), and after
    the first stage the inputs (the variants' plan arrays, the facts) are dropped. The
    rows are too wide for whole-stage code generation (more than
    ``spark.sql.codegen.maxFields``, or its code past 64 KB), so each projection writes
    every column it keeps: a few narrow projections rather than one per stage and
    variant, each copying every earlier variant's columns.
    """
    compiled = []
    for k, used in enumerate(variants.skeletons):
        tag = _tag(k)
        facts_k = Facts("c", tag=tag, hits="_hits", offset=f"_off{tag}")
        compiled.append(compiled_values(used, (facts_k,), tag=tag, shared=variants.shared[k]))
    carried = [*_KEEP, *(f"skel_id{_tag(k)}" for k in range(len(variants.skeletons)))]
    depth = max((len(c.stages) for c in compiled), default=0)
    for level in range(depth):
        # The facts' non-null copies and the clock are shared by the variants: once.
        items = {
            name: item
            for c in compiled
            if level < len(c.stages)
            for item in c.stages[level]
            if (name := item.rsplit(" AS ", 1)[1]) not in carried
        }
        rows = rows.selectExpr(*carried, *items.values())
        carried += list(items)
    verdicts = [f"{verdict_name(c.values['c'])} AS v{k}" for k, c in enumerate(compiled)]
    return rows.selectExpr(*_KEEP, *verdicts)


def _rate(violated: int, judged: int) -> float | None:
    return violated / judged if judged else None


def what_if(
    spark: SparkSession,
    source: str | Path | AuditInput,
    changes: Iterable[str | Change] | ChangeSet,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    explain: int = EXPLAINED,
    partitions: int | None = None,
) -> WhatIf:
    """Every decided CM of ``source`` in ``[since, until)`` (and the changes' own
    filters) judged over its counted acks under its recorded condition and under
    ``changes`` (texts of :mod:`spark_audit.changes`, e.g. ``["pickup=2h"]``)."""
    change_set = changes if isinstance(changes, ChangeSet) else parse_changes(changes)
    data, window = _window(spark, source, since, until)
    identity = ChangeSet(())
    judged, plans = _replay(
        spark, data, window, [identity, change_set], change_set.selection, partitions
    )
    senders = F.array(*(F.lit(name) for name in plans.senders)) if plans.senders else None
    cms = judged.join(plans.lookup("shape"), "plan_id", "left").select(
        "cm_id",
        (F.get(senders, F.col("sender_code")) if senders is not None else F.lit(None))
        .cast("string")
        .alias("sender"),
        "sent_at",
        "shape",
        "state",
        F.col("v0").alias("original"),
        F.col("v1").alias("replayed"),
    )
    # Cached: the totals and the flips read it again, and a filter or grouping planned
    # over the compiled verdicts would copy their expressions into itself.
    cms = cms.cache()
    # One grouping by the verdict pair: each verdict column is read once (an aggregate
    # reading it several times would inline its compiled expression into each).
    pairs = {
        (r["original"], r["replayed"]): r["count"]
        for r in cms.groupBy("original", "replayed").count().collect()
    }
    totals = _totals(pairs)
    totals["failure_rate_before"] = _rate(totals["violated_before"], totals["judged"])
    totals["failure_rate_after"] = _rate(totals["violated_after"], totals["judged"])
    flips = _explained(data, cms, change_set, explain) if explain else []
    return WhatIf(change_set.text, totals, cms, flips)


def _totals(pairs: dict[tuple[str | None, str | None], int]) -> dict[str, Any]:
    def total(test: Any) -> int:
        return sum(n for pair, n in pairs.items() if test(*pair))

    return {
        "judged": total(lambda a, b: a is not None and b is not None),
        "unjudged": total(lambda a, b: a is None or b is None),
        "violated_before": total(lambda a, _b: a == "violated"),
        "violated_after": total(lambda _a, b: b == "violated"),
        "flips_to_violated": total(lambda a, b: (a, b) == ("satisfied", "violated")),
        "flips_to_satisfied": total(lambda a, b: (a, b) == ("violated", "satisfied")),
    }


def _explained(
    data: AuditInput, cms: DataFrame, changes: ChangeSet, limit: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` flipped CMs with ``evaluate``'s reasons under both conditions."""
    flipped = (
        cms.where("original IS NOT NULL AND replayed IS NOT NULL AND original != replayed")
        .select("cm_id", "original", "replayed")
        .limit(limit)
        .collect()
    )
    if not flipped:
        return []
    ids = [r["cm_id"] for r in flipped]
    # Through Arrow, not collect(): its instants are UTC-aware, as evaluate requires
    # (collect() gives naive ones in the session's time zone).
    rows = (
        data.cms.where(F.col("cm_id").isin(ids))
        .select("cm_id", "condition_json", "sent_at")
        .toArrow()
        .to_pylist()
    )
    acks: dict[str, list[dict[str, Any]]] = {}
    for ack in (
        data.acks.where(F.col("cm_id").isin(ids) & (F.col("status") == COUNTED_STATUS))
        .select("cm_id", "destination", "recipient", "kind", "read_at", "committed_at")
        .toArrow()
        .to_pylist()
    ):
        acks.setdefault(ack["cm_id"], []).append(ack)
    by_id = {r["cm_id"]: r for r in flipped}
    found = []
    for cm in rows:
        original = condition_from_json(cm["condition_json"])
        try:
            changed = condition_to_json(changes.apply(original))
        except ConditionError:
            continue
        judged = []
        for text, condition in ((cm["condition_json"], original), (changed, None)):
            at = cm["sent_at"] + (condition or condition_from_json(text)).evaluation_window()
            judged.append(evaluate_row(text, cm["sent_at"], at, acks.get(cm["cm_id"], [])))
        before, after = judged[0][1], judged[1][1]
        flip = by_id[cm["cm_id"]]
        found.append(
            {
                "cm_id": cm["cm_id"],
                "original": flip["original"],
                "replayed": flip["replayed"],
                "reasons_before": before,
                "reasons_after": after,
                "reasons_lost": [r for r in before if r not in after],
                "reasons_gained": [r for r in after if r not in before],
            }
        )
    return found


def sweep(
    spark: SparkSession,
    source: str | Path | AuditInput,
    parameter: str,
    values: Sequence[str],
    *,
    changes: Iterable[str | Change] = (),
    since: datetime | None = None,
    until: datetime | None = None,
    partitions: int | None = None,
) -> Sweep:
    """The failure rate of the decided CMs with ``parameter`` (e.g. ``pickup``,
    ``process@qr3``, ``min_process``) set to each of ``values`` (after ``changes``), all
    variants judged in one pass over the data."""
    base = parse_changes(changes)
    grid = sweep_changes(parameter, values)
    sets = [ChangeSet(()), *(ChangeSet((*base.changes, g), base.selection) for g in grid)]
    data, window = _window(spark, source, since, until)
    judged, _ = _replay(spark, data, window, sets, base.selection, partitions, ids=False)
    # Judged CMs in the low 32 bits, violated ones above: one read of each verdict column.
    weights = "map('violated', 4294967297L, 'satisfied', 1L, 'pending', 1L)"
    sums = [f"sum(coalesce(element_at({weights}, v{k}), 0L)) AS s{k}" for k in range(len(sets))]
    row = judged.selectExpr(*sums).first()
    assert row is not None
    tallies = [divmod(int(row[f"s{k}"] or 0), 1 << 32) for k in range(len(sets))]
    points = [
        {
            "value": value,
            "judged": tallies[k][1],
            "violated": tallies[k][0],
            "failure_rate": _rate(tallies[k][0], tallies[k][1]),
        }
        for k, value in enumerate(["recorded", *values])
    ]
    return Sweep(parameter, points[1:], points[0])
