"""Condition plans in Spark: one :func:`spark_audit.plans.plan_of` per distinct condition.

Conditions repeat (an application sends a few condition templates), so plans are made per
*distinct* ``condition_json`` and attached to the CMs by a small ``plan_id``: the per-CM
cost is a broadcast lookup, not a decode. With up to :data:`MAX_DRIVER_PLANS` distinct
conditions (the normal case) the driver decodes them; beyond that the decode runs on the
executors (``mapInArrow``) and ``plan_id`` is a 64-bit hash of the condition, checked for
collisions.

The :class:`PlanSet` also holds the compiled skeletons: up to :data:`MAX_SKELETONS` of the
most used skeletons whose trees fit the compiled path (``Plan.native``) are judged by
Spark expressions (:mod:`spark_audit.reevaluate.compiled`); every other valid condition
by ``condmsg.evaluate`` (:mod:`spark_audit.reevaluate.fallback`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from condmsg.core.condition_codec import condition_from_json
from spark_audit.plans import Numbered, numbered, plan_of
from spark_audit.schemas import local_frame

#: The driver decodes at most this many distinct conditions (else the executors do).
MAX_DRIVER_PLANS = 10_000
#: At most this many skeletons are compiled into the verdict expression.
MAX_SKELETONS = 32

_LONGS = T.ArrayType(T.LongType())
#: A plan's per-node arrays (indexed by node number): the deadlines and counts the
#: compiled verdicts read, and all a change of the condition can alter in them.
NODE_ARRAYS = (
    "node_pickup_ms",
    "node_process_ms",
    "node_min_pickup",
    "node_max_pickup",
    "node_min_process",
    "node_max_process",
)
_SENDERS = T.StructType(
    [T.StructField("_sender_name", T.StringType()), T.StructField("sender_code", T.IntegerType())]
)
PLAN_SCHEMA = T.StructType(
    [
        T.StructField("condition_json", T.StringType()),
        T.StructField("valid", T.BooleanType()),
        T.StructField("error", T.StringType()),
        T.StructField("shape", T.StringType()),
        T.StructField("skeleton", T.StringType()),
        T.StructField("eval_window_ms", T.LongType()),
        T.StructField("structurally_native", T.BooleanType()),
        T.StructField("leaf_count", T.IntegerType()),
        T.StructField("leaf_names", T.ArrayType(T.StringType())),
        T.StructField("leaf_recipients", T.ArrayType(T.StringType())),
        T.StructField("leaf_topic", T.ArrayType(T.BooleanType())),
        T.StructField("leaf_required", T.ArrayType(T.BooleanType())),
        T.StructField("leaf_pickup_ms", _LONGS),
        T.StructField("leaf_process_ms", _LONGS),
        *(T.StructField(name, _LONGS) for name in NODE_ARRAYS),
        T.StructField("probe_slot", T.ArrayType(T.IntegerType())),
        T.StructField("probe_process", T.ArrayType(T.BooleanType())),
        T.StructField("probe_ms", _LONGS),
    ]
)


def leaf_key(plan: str, destination: str) -> Column:
    """The one (long) equi-join key of a plan's destination: ``xxhash64`` of both."""
    return F.xxhash64(plan, destination)


def sender_key(column: str) -> Column:
    """The (long) equi-join key of a sender's name: ``xxhash64`` of it."""
    return F.xxhash64(column)


def same_text(left: str, right: str) -> Column:
    """``left = right`` for strings (null if either is null), written so that Spark keeps
    it as a join's condition instead of taking it as a second equi-join key (a join on a
    single long key builds a hash table keyed by longs)."""
    a, b = F.col(left), F.col(right)
    return F.startswith(a, b) & F.startswith(b, a)


def _hash() -> Column:
    """The 64-bit lookup key of a condition (see :meth:`PlanSet.attach`)."""
    return F.xxhash64("condition_json")


@dataclass(frozen=True, slots=True)
class PlanSet:
    """The plans of a set of CMs.

    ``frame``: :data:`PLAN_SCHEMA` plus ``plan_id`` (long), ``skel_id`` (int, null when not
    compiled) and ``native``. ``skeletons``: the compiled skeletons by ``skel_id``, as
    numbered representative trees. ``slots``: the most destinations of any valid plan
    (the width of the per-destination facts); ``probes``: the most probes of a compiled
    plan. ``python``: some valid condition is judged by ``evaluate``. ``small``: the
    frame is broadcast in joins.
    """

    frame: DataFrame
    skeletons: dict[int, Numbered]
    slots: int
    probes: int
    python: bool
    small: bool
    #: With ``plan_set(..., chosen=...)``: the chosen CMs' ``cms`` (count), ``first`` and
    #: ``last`` (``sent_at``), gathered by the same scan.
    chosen: dict[str, Any] | None = None
    #: Every destination the plans name, sorted (only with the plans on the driver): a
    #: leaf's ``leaf_code`` (:meth:`leaves`) is its name's index here.
    destinations: tuple[str, ...] = ()
    #: With ``plan_set(..., senders=True)``: every sender of the CMs (not null), sorted; a
    #: CM's ``sender_code`` (:meth:`sender_codes`) is its sender's index here.
    senders: tuple[str, ...] = ()

    def lookup(self, *columns: str) -> DataFrame:
        """``plan_id`` and ``columns`` of the plans, broadcast when small."""
        frame = self.frame.select("plan_id", *columns)
        return F.broadcast(frame) if self.small else frame

    def with_leaves(self, rows: DataFrame) -> DataFrame:
        """``rows`` (with ``plan_id`` and ``destination``) with their destination's ``slot,
        leaf_recipient, leaf_topic, leaf_pickup_ms, leaf_process_ms`` in the plan (null
        where the plan does not name it): a left join with :meth:`leaves` on
        :func:`leaf_key`, the plan and the destination compared exactly beside it."""
        on = (
            (leaf_key("plan_id", "destination") == F.col("leaf_key"))
            & ((F.col("plan_id") - F.col("leaf_plan")) == 0)
            & same_text("destination", "leaf_destination")
        )
        return rows.join(self.leaves(), on, "left").drop(
            "leaf_key", "leaf_plan", "leaf_destination"
        )

    def leaves(self) -> DataFrame:
        """``leaf_key, leaf_plan, leaf_destination, slot, leaf_recipient, leaf_topic,
        leaf_pickup_ms, leaf_process_ms, leaf_code``: one row per destination of a plan
        (its position in ``leaf_names``), broadcast when small. ``leaf_code``: the
        destination's index in :attr:`destinations` (null without them).

        A join on ``(plan_id, destination)`` finds an ack's slot with one lookup in a
        small hash table, instead of copying the plan's arrays into every ack row
        (:meth:`with_leaves`)."""
        slot = F.col("slot")
        frame = self.frame.select(
            "plan_id",
            F.posexplode("leaf_names").alias("slot", "destination"),
            "leaf_recipients",
            "leaf_topic",
            "leaf_pickup_ms",
            "leaf_process_ms",
            (
                F.col("leaf_codes")
                if self.destinations
                else F.lit(None).cast("array<int>").alias("leaf_codes")
            ),
        ).select(
            leaf_key("plan_id", "destination").alias("leaf_key"),
            F.col("plan_id").alias("leaf_plan"),
            F.col("destination").alias("leaf_destination"),
            slot.cast("int").alias("slot"),
            F.get(F.col("leaf_recipients"), slot).alias("leaf_recipient"),
            F.coalesce(F.get(F.col("leaf_topic"), slot), F.lit(False)).alias("leaf_topic"),
            F.get(F.col("leaf_pickup_ms"), slot).alias("leaf_pickup_ms"),
            F.get(F.col("leaf_process_ms"), slot).alias("leaf_process_ms"),
            F.get(F.col("leaf_codes"), slot).cast("int").alias("leaf_code"),
        )
        return F.broadcast(frame) if self.small else frame

    def sender_codes(self, cms: DataFrame) -> DataFrame:
        """``cms`` with ``sender_code``: the index of its ``sender`` in :attr:`senders` (null
        for a null sender or without senders). A broadcast join on a 64-bit hash of the
        name, the names compared exactly beside it."""
        if not self.senders:
            return cms.withColumn("sender_code", F.lit(None).cast("int"))
        codes = local_frame(
            cms.sparkSession,
            [{"_sender_name": name, "sender_code": code} for code, name in enumerate(self.senders)],
            _SENDERS,
        ).select(sender_key("_sender_name").alias("_sender_hash"), "_sender_name", "sender_code")
        on = (sender_key("sender") == F.col("_sender_hash")) & same_text("sender", "_sender_name")
        return cms.join(F.broadcast(codes), on, "left").drop("_sender_hash", "_sender_name")

    def attach(self, cms: DataFrame) -> DataFrame:
        """``cms`` with the ``plan_id`` of their ``condition_json``.

        With the plans on the driver, the lookup key is a 64-bit hash of the condition
        (checked unique among the distinct conditions), so no CM row compares strings.
        """
        if self.small:
            ids = F.broadcast(self.frame.select(_hash().alias("_condition_hash"), "plan_id"))
            return cms.withColumn("_condition_hash", _hash()).join(ids, "_condition_hash", "left")
        ids = self.frame.select("condition_json", "plan_id")
        return cms.join(ids, "condition_json", "left")


def _frame_rows(
    plans: list[dict[str, Any]], skel_ids: dict[str, int], codes: dict[str, int]
) -> list[dict[str, Any]]:
    return [
        {
            **row,
            "plan_id": index,
            "skel_id": skel_ids.get(row["skeleton"]) if row["structurally_native"] else None,
            "leaf_codes": [codes[name] for name in row["leaf_names"] or ()],
        }
        for index, row in enumerate(plans)
    ]


def _destinations(plans: list[dict[str, Any]]) -> tuple[str, ...]:
    """Every destination name of ``plans`` (rows), sorted."""
    return tuple(sorted({name for row in plans for name in row["leaf_names"] or ()}))


def _with_ids_schema() -> T.StructType:
    return T.StructType(
        [
            *PLAN_SCHEMA.fields,
            T.StructField("plan_id", T.LongType()),
            T.StructField("skel_id", T.IntegerType()),
            T.StructField("leaf_codes", T.ArrayType(T.IntegerType())),
        ]
    )


def _chosen(weights: Counter[str]) -> dict[str, int]:
    """Skeleton -> ``skel_id`` for the :data:`MAX_SKELETONS` most used skeletons."""
    top = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SKELETONS]
    return {skeleton: index for index, (skeleton, _) in enumerate(top)}


def _chosen_stats(chosen: Column) -> list[Column]:
    sent = F.when(chosen, F.col("sent_at"))
    return [
        F.count(F.when(chosen, 1)).alias("_chosen"),
        F.min(sent).alias("_first"),
        F.max(sent).alias("_last"),
    ]


def _fold_chosen(rows: list[Any]) -> dict[str, Any]:
    firsts = [r["_first"] for r in rows if r["_first"] is not None]
    lasts = [r["_last"] for r in rows if r["_last"] is not None]
    return {
        "cms": sum(int(r["_chosen"]) for r in rows),
        "first": min(firsts, default=None),
        "last": max(lasts, default=None),
    }


def plan_set(
    cms: DataFrame, *, native: bool = True, chosen: Column | None = None, senders: bool = False
) -> PlanSet:
    """The :class:`PlanSet` of ``cms`` (``native=False``: compile nothing, for tests).

    ``chosen`` (a condition on ``cms``, e.g. the window's): also count those CMs and the
    span of their ``sent_at`` in the same scan (:attr:`PlanSet.chosen`). ``senders``: also
    every sender (:attr:`PlanSet.senders`), from the same scan grouped by condition and
    sender (else, with many conditions, from a scan of their own).
    """
    stats = _chosen_stats(chosen) if chosen is not None else []
    keys = ("condition_json", "sender") if senders else ("condition_json",)
    counted = cms.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("count"), F.max(_hash()).alias("hash"), *stats
    )
    rows = counted.limit(MAX_DRIVER_PLANS + 1).collect()
    by_text: dict[str, int] = {}
    hashes: dict[str, int] = {}
    for row in rows:
        by_text[row["condition_json"]] = by_text.get(row["condition_json"], 0) + row["count"]
        hashes[row["condition_json"]] = row["hash"]
    if len(rows) > MAX_DRIVER_PLANS or len(set(hashes.values())) < len(hashes):
        per_condition = cms.groupBy("condition_json").agg(F.count(F.lit(1)).alias("count"))
        found = _executor_plan_set(cms, per_condition, native=native)
        if senders:
            names = cms.where(F.col("sender").isNotNull()).select("sender").distinct().collect()
            found = replace(found, senders=tuple(sorted(r["sender"] for r in names)))
        if chosen is None:
            return found
        return replace(found, chosen=_fold_chosen(cms.agg(*_chosen_stats(chosen)).collect()))
    texts = list(by_text)
    plans = [plan_of(text) for text in texts]
    weights: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for plan, text in zip(plans, texts, strict=True):
        if plan.native and native:
            weights[plan.skeleton] += by_text[text]
            examples.setdefault(plan.skeleton, plan.condition_json)
    skel_ids = _chosen(weights)
    as_rows = [p.as_row() for p in plans]
    destinations = _destinations(as_rows)
    codes = {name: code for code, name in enumerate(destinations)}
    data = _frame_rows(as_rows, skel_ids, codes)
    frame = local_frame(cms.sparkSession, data, _with_ids_schema()).withColumn(
        "native", F.col("skel_id").isNotNull()
    )
    compiled = [p for p in plans if p.skeleton in skel_ids and p.native]
    return PlanSet(
        frame=frame,
        skeletons={i: numbered(condition_from_json(examples[s])) for s, i in skel_ids.items()},
        slots=max((len(p.leaves) for p in plans if p.valid), default=0),
        probes=max((len(p.probes) for p in compiled), default=0),
        python=any(p.valid and p.skeleton not in skel_ids for p in plans),
        small=True,
        chosen=_fold_chosen(rows) if chosen is not None else None,
        destinations=destinations,
        senders=(
            tuple(sorted({r["sender"] for r in rows if r["sender"] is not None})) if senders else ()
        ),
    )


def _plan_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    schema = to_arrow_schema(PLAN_SCHEMA)
    for batch in batches:
        rows = [plan_of(text).as_row() for text in batch.column(0).to_pylist()]
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def _executor_plan_set(cms: DataFrame, counted: DataFrame, *, native: bool) -> PlanSet:
    """Many distinct conditions: decode them on the executors (see the module doc)."""
    decoded = (
        counted.select("condition_json")
        .mapInArrow(_plan_batches, PLAN_SCHEMA)
        .withColumn("plan_id", F.xxhash64("condition_json"))
        .localCheckpoint()
    )
    stats = decoded.agg(
        F.count(F.lit(1)).alias("plans"),
        F.countDistinct("plan_id").alias("ids"),
        F.max(F.when(F.col("valid"), F.col("leaf_count"))).alias("slots"),
        F.max((F.col("valid") & ~F.col("structurally_native")).cast("int")).alias("wide"),
    ).first()
    assert stats is not None
    if stats["plans"] != stats["ids"]:
        raise RuntimeError("plan_id hash collision between distinct conditions")
    weights: Counter[str] = Counter()
    examples: dict[str, str] = {}
    if native:
        per_skeleton = (
            decoded.where("structurally_native")
            .join(counted, "condition_json")
            .groupBy("skeleton")
            .agg(F.sum("count").alias("cms"), F.min("condition_json").alias("example"))
            .collect()
        )
        for row in per_skeleton:
            weights[row["skeleton"]] = row["cms"]
            examples[row["skeleton"]] = row["example"]
    skel_ids = _chosen(weights)
    skel_map: Column = (
        F.create_map(*chain.from_iterable((F.lit(s), F.lit(i)) for s, i in skel_ids.items()))
        if skel_ids
        else F.create_map().cast("map<string,int>")
    )
    skel_id = F.when(F.col("structurally_native"), F.try_element_at(skel_map, F.col("skeleton")))
    frame = (
        decoded.withColumn("skel_id", skel_id.cast("int"))
        .withColumn("native", F.col("skel_id").isNotNull())
        .localCheckpoint()
    )
    probes = frame.where("native").agg(F.max(F.size("probe_ms"))).first()
    python = frame.where(F.col("valid") & ~F.col("native")).limit(1).count() > 0
    return PlanSet(
        frame=frame,
        skeletons={i: numbered(condition_from_json(examples[s])) for s, i in skel_ids.items()},
        slots=int(stats["slots"] or 0),
        probes=int((probes[0] if probes else 0) or 0),
        python=python or bool(stats["wide"]),
        small=False,
    )
