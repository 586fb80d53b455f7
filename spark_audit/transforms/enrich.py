"""The audit's shared frames, built with one shuffle of the CMs and one of the acks.

1. :func:`cut_cms`: every CM of the source, one row each, hash-partitioned by ``cm_key``
   (:func:`cm_key`) with its ``plan_id`` and whether it is in the window (the cut, DESIGN
   section 6). CMs outside the window stay (without them an ack of theirs would look like
   an orphan).
2. :func:`enrich_acks`: every ack in the cut, and every released compensation, with its
   CM's columns and the destination *slot* of its CM's plan (the acks are shuffled once to
   the CMs' partitioning; the join itself moves nothing more). The audit caches it
   without text: the CM as the numbers ``(cm_key, cm_rank)``, ``kind`` and ``status`` as
   codes, the destination as its code in the plans' destinations.
3. :func:`cm_facts`: per CM in the window, its columns and the facts its verdict and its
   deadline misses are judged from (:mod:`spark_audit.reevaluate.compiled`): one
   aggregation over the CM rows and the ack rows together (acks of a topic destination
   grouped per recipient first), all on the same partitioning, so nothing is shuffled and
   no join is needed (a CM without acks has its own row), grouped by the CM's numbers.
4. :func:`judge`: every CM in the window with its recomputed verdict (counted acks), its
   compensations and its per-destination deadline misses.

Instants are integer microseconds (``*_us``); durations are derived where they are used.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from condmsg.archive_layout import AckStatus
from spark_audit.readers import Window, decided_after, seen_in, sent_in
from spark_audit.reevaluate import VERDICTS, well_formed
from spark_audit.reevaluate.compiled import COUNTED, compiled_values, verdict_name
from spark_audit.schemas import local_frame
from spark_audit.transforms.conditions import PlanSet, same_text

COUNTED_STATUS = AckStatus.COUNTED.value
#: An ack's ``status`` as a number in the cached acks (``status_code``): its index here,
#: -1 for any other text (null stays null).
STATUS_CODES = {status.value: code for code, status in enumerate(AckStatus)}
COUNTED_CODE = STATUS_CODES[COUNTED_STATUS]
CHANGES_VERDICT_CODE = STATUS_CODES[AckStatus.CHANGES_VERDICT.value]
#: The consumer key of every ack of a queue destination (a queue copy is consumed once).
QUEUE_CONSUMER = ""
#: The consumer key of a topic ack without a recipient (``evaluate``'s name for it).
ANONYMOUS = "(anonymous)"
#: A CM's state as a number (fixed-width aggregation buffers); anything else is ``OTHER``.
STATES = ("pending", "satisfied", "violated")
OTHER_STATE = len(STATES)
_RANKS = T.StructType(
    [
        T.StructField("cm_key", T.LongType()),
        T.StructField("cm_id", T.StringType()),
        T.StructField("cm_rank", T.IntegerType()),
    ]
)


def _us(column: str) -> Column:
    return F.unix_micros(F.col(column))


def _state_code(state: Column) -> Column:
    code = F.lit(OTHER_STATE)
    for index, name in reversed(list(enumerate(STATES))):
        code = F.when(state == name, F.lit(index)).otherwise(code)
    return code


def state_name(code: Column) -> Column:
    name = F.lit(None).cast("string")
    for index, value in reversed(list(enumerate(STATES))):
        name = F.when(code == index, F.lit(value)).otherwise(name)
    return name


def cm_key(column: str = "cm_id") -> Column:
    """``cm_key``: a 64-bit hash of ``cm_id``, the shared frames' partitioning key.

    Joins take it as their one equi-join key (Spark then builds a hash table keyed by a
    long, not by 36-byte strings) and compare the ids themselves exactly
    (:func:`same_text`), and groupings by CM include it (so they run on the shared
    frames' partitioning): two ids with one hash stay apart.
    """
    return F.xxhash64(column).alias("cm_key")


def status_code(status: Column) -> Column:
    """:data:`STATUS_CODES` of an ack's ``status`` (a tinyint)."""
    code = F.lit(-1)
    for name, value in reversed(STATUS_CODES.items()):
        code = F.when(status == name, F.lit(value)).otherwise(code)
    return F.when(status.isNotNull(), code).cast("tinyint")


def counted() -> Column:
    """An ack the evaluator counted (``status_code``)."""
    return F.col("status_code") == COUNTED_CODE


def cut_cms(
    cms: DataFrame,
    plans: PlanSet,
    window: Window | None,
    partitions: int,
    ranks: DataFrame | None = None,
) -> DataFrame:
    """Every CM of ``cms`` with ``in_window`` and its state as of ``window.until``.

    A decision taken after ``until`` is not visible yet (state ``pending``, no decision
    instants). Columns: ``cm_key`` (:func:`cm_key`), ``cm_rank`` (see below), ``cm_id,
    in_window, sender_code`` (:meth:`PlanSet.sender_codes`; the name is not kept),
    ``sent_at, sent_us, plan_id, state_code (:data:`STATES`), decided_at, effective_at,
    evaluation_deadline``; ``partitions`` partitions by ``cm_key``.

    ``(cm_key, cm_rank)`` is the CM's numeric identity, what every grouping by CM keys
    on: ``cm_rank`` is 0, except for CMs whose ``cm_key`` another CM shares, which
    ``ranks`` (:func:`cm_ranks`: ``cm_key, cm_id, cm_rank``) numbers apart.
    """
    state, decided, effective = F.col("state"), F.col("decided_at"), F.col("effective_at")
    in_window: Column = F.lit(True)
    if window is not None:
        in_window = sent_in(window)
        late = decided_after(window)
        state = F.when(late, F.lit("pending")).otherwise(state)
        decided = F.when(~late, decided)
        effective = F.when(~late, effective)
    cut = plans.sender_codes(plans.attach(cms)).select(
        cm_key(),
        "cm_id",
        in_window.alias("in_window"),
        "sender_code",
        "sent_at",
        _us("sent_at").alias("sent_us"),
        "plan_id",
        _state_code(state).alias("state_code"),
        decided.alias("decided_at"),
        effective.alias("effective_at"),
        "evaluation_deadline",
    )
    if ranks is None:
        cut = cut.withColumn("cm_rank", F.lit(0))
    else:
        numbered = ranks.select(
            F.col("cm_key").alias("_rank_key"),
            F.col("cm_id").alias("_rank_id"),
            F.col("cm_rank").alias("_rank"),
        )
        on = (F.col("cm_key") == F.col("_rank_key")) & same_text("cm_id", "_rank_id")
        cut = (
            cut.join(F.broadcast(numbered), on, "left")
            .withColumn("cm_rank", F.coalesce(F.col("_rank"), F.lit(0)))
            .drop("_rank_key", "_rank_id", "_rank")
        )
    return cut.repartition(partitions, "cm_key")


def cm_ranks(cms_cut: DataFrame) -> DataFrame | None:
    """``cm_key, cm_id, cm_rank`` of the CMs of :func:`cut_cms` whose ``cm_key`` another
    CM shares (``cm_rank``: the id's place among the distinct ids of that key, in order),
    or ``None`` where every key is one CM's (one aggregation; normally none shares one).
    Rows with one id (a duplicated CM) keep one rank: they stay one CM, as grouping by
    the id would keep them."""
    shared = cms_cut.groupBy("cm_key").count().where("count > 1").select("cm_key")
    rows = cms_cut.join(shared, "cm_key", "left_semi").select("cm_key", "cm_id").collect()
    if not rows:
        return None
    by_key: dict[int, list[str]] = {}
    for row in rows:
        by_key.setdefault(row["cm_key"], []).append(row["cm_id"])
    numbered = [
        {"cm_key": key, "cm_id": cm_id, "cm_rank": rank}
        for key, ids in by_key.items()
        for rank, cm_id in enumerate(sorted(set(ids)))
    ]
    return local_frame(cms_cut.sparkSession, numbered, _RANKS)


def enrich_acks(
    acks: DataFrame,
    compensations: DataFrame,
    cms_cut: DataFrame,
    plans: PlanSet,
    window: Window | None,
    *,
    text: bool = True,
) -> DataFrame:
    """Every ack in the cut, with its CM's columns (``known`` false for an orphan), and
    every compensation released by ``until`` (``is_comp``: its ``received_us`` is the
    release; it rides along so the one join serves both).

    The cut: acks received by ``until``, of CMs in the window, and orphans (no CM in the
    source at all) received in the window. Per ack: ``wf`` (well-formed: ``condmsg.Ack``
    accepts it), ``slot`` (its destination's position in the CM's plan, null if the
    condition does not name it), ``matched`` (counts for that destination: the recipient
    matches where the destination names one), ``topic`` (a topic destination: see
    :func:`consumer`), ``on_time_pickup``/``on_time_process`` (matched, and
    read/committed by the tightest deadline that applies to its destination: its
    deadline misses) and ``dest_code``
    (the destination's index in ``plans.destinations`` where the plan names it, else
    null: a number the latency histogram groups by instead of the name).

    Numbers stand for the ack's text: ``cm_key, cm_rank`` for its CM (see
    :func:`cut_cms`), ``commit`` for ``kind``, ``status_code`` (:func:`status_code`) for
    ``status``, ``dest_code`` for the destination (``other_destination`` is its name
    where ``dest_code`` is null). ``text``: also the text columns ``ack_id, cm_id,
    destination, kind, status`` (:data:`TEXT_COLUMNS`; without them the audit's cache of
    this frame costs about 40 % less to build, see docs/audit.md).
    """
    released = compensations.where(F.col("released_at").isNotNull()).select(
        F.lit(None).cast("string").alias("ack_id"),
        "cm_id",
        "destination",
        F.lit(None).cast("string").alias("recipient"),
        F.lit(None).cast("string").alias("receiver"),
        F.lit("compensation").alias("kind"),
        F.lit(None).cast("timestamp").alias("read_at"),
        F.lit(None).cast("timestamp").alias("committed_at"),
        F.col("released_at").alias("received_at"),
        F.lit(None).cast("string").alias("status"),
        F.lit(True).alias("is_comp"),
    )
    events = acks.select(*released.columns[:-1], F.lit(False).alias("is_comp")).unionByName(
        released
    )
    orphan_ok: Column = F.lit(True)
    if window is not None:
        events = events.where(F.col("received_at") <= F.lit(window.until))
        orphan_ok = seen_in(window, "received_at")
    cms = cms_cut.select(
        F.col("cm_key").alias("_cm_key"),
        F.col("cm_id").alias("_cm_id"),
        "cm_rank",
        "in_window",
        "sent_us",
        "plan_id",
        _us("decided_at").alias("decided_us"),
    )
    on_cm = (F.col("cm_key") == F.col("_cm_key")) & same_text("cm_id", "_cm_id")
    # What the ack alone decides is computed before the shuffle (without ``text``, its
    # ``kind`` and ``status`` then do not travel).
    coded = events.select(
        "*",
        cm_key(),
        (F.coalesce(well_formed(), F.lit(False)) & ~F.col("is_comp")).alias("wf"),
        (F.col("kind") == "commit").alias("commit"),
        status_code(F.col("status")).alias("status_code"),
    )
    joined = coded.join(cms.hint("shuffle_hash"), on_cm, "left")
    known = F.col("in_window").isNotNull()
    in_cut = F.coalesce(F.col("in_window"), F.lit(False)) | (~known & orphan_ok & ~F.col("is_comp"))
    with_leaves = plans.with_leaves(joined.where(in_cut))
    enriched = (
        with_leaves.select(
            "cm_key",
            "cm_rank",
            "ack_id",
            "cm_id",
            "destination",
            "recipient",
            "receiver",
            "kind",
            "status",
            _us("read_at").alias("read_us"),
            _us("committed_at").alias("committed_us"),
            _us("received_at").alias("received_us"),
            "is_comp",
            known.alias("known"),
            "wf",
            "commit",
            "status_code",
            "sent_us",
            "decided_us",
            "plan_id",
            "slot",
            F.col("leaf_recipient").alias("_named"),
            F.coalesce(F.col("leaf_topic"), F.lit(False)).alias("topic"),
            "leaf_pickup_ms",
            "leaf_process_ms",
            F.col("leaf_code").alias("dest_code"),
        )
        .select(
            "*",
            (
                F.col("slot").isNotNull()
                & (F.col("_named").isNull() | (F.col("recipient") == F.col("_named")))
            ).alias("matched"),
        )
        .selectExpr(
            "*",
            *(
                f"coalesce(matched AND {first} <= sent_us + leaf_{kind}_ms * 1000, false) "
                f"AS on_time_{kind}"
                for kind, first in (
                    ("pickup", "read_us"),
                    ("process", "CASE WHEN commit THEN committed_us END"),
                )
            ),
        )
        .drop("_named", "leaf_pickup_ms", "leaf_process_ms")
    )
    other = F.when(F.col("dest_code").isNull(), F.col("destination"))
    kept = [c for c in enriched.columns if text or c not in TEXT_COLUMNS]
    return enriched.select(*kept, other.alias("other_destination"))


#: The text columns :func:`enrich_acks` leaves out with ``text=False``.
TEXT_COLUMNS = ("ack_id", "cm_id", "destination", "kind", "status")

#: The boolean columns of :func:`enrich_acks` that :func:`pack_flags` stores as bits of
#: one ``flags`` integer (two bits each: the value and whether it is null).
FLAG_COLUMNS = (
    "is_comp",
    "known",
    "wf",
    "commit",
    "topic",
    "matched",
    "on_time_pickup",
    "on_time_process",
)


def pack_flags(enriched: DataFrame) -> DataFrame:
    """``enriched`` with :data:`FLAG_COLUMNS` as the bits of one ``flags`` int.

    For the audit's cache of the acks: Spark builds a cached column per column, and eight
    boolean columns cost about as much to build as eight wide ones, where one int column
    costs one. :func:`unpack_flags` gives the columns back (nulls included), so every
    reader of the cache sees :func:`enrich_acks`' columns.
    """
    bits = " + ".join(
        f"CASE WHEN {name} IS NULL THEN {1 << (2 * i + 1)} WHEN {name} THEN {1 << (2 * i)} "
        "ELSE 0 END"
        for i, name in enumerate(FLAG_COLUMNS)
    )
    kept = [c for c in enriched.columns if c not in FLAG_COLUMNS]
    return enriched.selectExpr(*kept, f"CAST({bits} AS INT) AS flags")


def unpack_flags(packed: DataFrame) -> DataFrame:
    """The inverse of :func:`pack_flags` (a projection over the cache, fused into the
    code that reads it)."""
    flags = [
        f"CASE WHEN flags & {1 << (2 * i + 1)} != 0 THEN NULL ELSE flags & {1 << (2 * i)} != 0 "
        f"END AS {name}"
        for i, name in enumerate(FLAG_COLUMNS)
    ]
    kept = [c for c in packed.columns if c != "flags"]
    return packed.selectExpr(*kept, *flags)


def consumer() -> Column:
    """The consumption an ack of :func:`enrich_acks` belongs to: the recipient for a
    topic destination (:data:`ANONYMOUS` without one), else one per destination
    (:data:`QUEUE_CONSUMER`). Computed where it is used rather than cached with the
    acks (a string column less to build)."""
    return (
        F.when(F.col("topic"), F.coalesce(F.col("recipient"), F.lit(ANONYMOUS)))
        .otherwise(F.lit(QUEUE_CONSUMER))
        .alias("consumer")
    )


def acks_only(enriched: DataFrame) -> DataFrame:
    """The ack rows of :func:`enrich_acks` (without the compensations)."""
    return enriched.where(~F.col("is_comp"))


def judging_acks(enriched: DataFrame) -> DataFrame:
    """The well-formed acks of known CMs in the layout ``condmsg.evaluate`` is handed
    (:data:`spark_audit.reevaluate.fallback.ACK_FIELDS`)."""
    return enriched.where(F.col("known") & F.col("wf")).select(
        "cm_id",
        "destination",
        "recipient",
        "kind",
        F.timestamp_micros("read_us").alias("read_at"),
        F.timestamp_micros(commit_us()).alias("committed_at"),
        counted().alias("counted"),
    )


def commit_us_if(taken: Column) -> Column:
    """:func:`commit_us` where ``taken``, else null."""
    return F.when(taken, commit_us())


def commit_us() -> Column:
    """``committed_at`` (µs) of a COMMIT ack, else null."""
    return F.when(F.col("commit"), F.col("committed_us"))


_CM_COLUMNS = ("sent_at", "state_code", "decided_at", "effective_at", "evaluation_deadline")
_FACT_KEYS = ("cm_key", "cm_rank", "plan_id", "sent_us", "slot")


def _fact_rows(enriched: DataFrame, plans: PlanSet) -> DataFrame:
    """The ack and compensation rows :func:`cm_facts` aggregates (acks' partitioning).

    An ack of a queue destination (or of none in the tree) is its own row; the acks of a
    topic destination are first grouped per recipient (``topic`` rows), since a topic is
    judged per recipient. Per row: ``n_wf`` acks; over the matching counted acks: ``n_c``
    acks, ``r_c`` first read, ``m_c`` first commit; ``on_time_pickup``/``on_time_process``
    (1 if a matching ack, counted or not, was in time, see :func:`enrich_acks`);
    ``late`` acks not counted, ``flag`` (one is labelled ``changes_verdict``), ``comp`` (a
    compensation released to the slot's destination); on a topic row, ``h{j}`` (1 if the
    recipient was in time for the plan's probe ``j``, else null).
    """
    rows = enriched.where(F.col("known") & F.col("wf"))
    is_counted = counted()
    taken = F.col("matched") & is_counted
    single: list[tuple[str, Column]] = [
        ("n_wf", F.lit(1).cast("long")),
        ("n_c", F.when(taken, F.lit(1)).otherwise(F.lit(0)).cast("long")),
        ("r_c", F.when(taken, F.col("read_us"))),
        ("m_c", commit_us_if(taken)),
    ]
    grouped = [
        F.count(F.lit(1)).alias("n_wf"),
        F.count(F.when(taken, 1)).alias("n_c"),
        F.min(F.when(taken, F.col("read_us"))).alias("r_c"),
        F.min(commit_us_if(taken)).alias("m_c"),
    ]
    for name in ON_TIME:
        single.append((name, F.col(name).cast("int")))
        grouped.append(F.max(F.col(name).cast("int")).alias(name))
    late = F.when(~is_counted, F.lit(1)).otherwise(F.lit(0)).cast("long")
    flag = (F.col("status_code") == CHANGES_VERDICT_CODE).cast("int")
    # The queue acks and the compensations in one scan (a compensation row has only its
    # slot and ``comp``), the topic acks grouped per recipient in another.
    ack = ~F.col("is_comp")
    acks = enriched.where(
        F.col("known") & ((F.col("wf") & ~F.col("topic")) | F.col("is_comp"))
    ).select(
        *_FACT_KEYS,
        *(F.when(ack, column).alias(name) for name, column in single),
        F.when(ack, late).alias("late"),
        F.when(ack, flag).alias("flag"),
        F.when(ack, F.lit(False)).alias("topic"),
        F.when(ack, F.lit(0)).otherwise(F.lit(1)).alias("comp"),
    )
    recipients = (
        rows.where(F.col("topic"))
        .groupBy(*_FACT_KEYS, consumer())
        .agg(*grouped, F.sum(late).alias("late"), F.max(flag).alias("flag"))
        .drop("consumer")
        .withColumn("topic", F.lit(True))
        .withColumn("comp", F.lit(0))
    )
    if plans.probes:
        # The probes' parameters only on the topic rows (a few per cent of the rows),
        # rather than the plan's arrays on every row of the per-CM aggregation.
        probes = plans.lookup("probe_slot", "probe_process", "probe_ms")
        hits = []
        for j in range(plans.probes):
            first = f"CASE WHEN get(probe_process, {j}) THEN m_c ELSE r_c END"
            deadline = f"sent_us + get(probe_ms, {j}) * 1000"
            hit = f"slot = get(probe_slot, {j}) AND {first} <= {deadline}"
            hits.append(f"CASE WHEN {hit} THEN 1 END AS h{j}")
        recipients = (
            recipients.join(probes, "plan_id", "left")
            .selectExpr("*", *hits)
            .drop("probe_slot", "probe_process", "probe_ms")
        )
    return acks.unionByName(recipients, allowMissingColumns=True)


#: The per-ack deadline flags of :func:`enrich_acks`, and their per-CM bit masks.
ON_TIME = ("on_time_pickup", "on_time_process")
MASKS = {"on_time_pickup": "_pmask", "on_time_process": "_mmask", "comp": "_compmask"}


def slot_bit(mask: str, slot: int) -> str:
    """Whether ``slot``'s bit is set in the per-CM ``mask`` (SQL text; false if null):
    masks are words of 64 slots, ``{mask}{w}`` for slots ``64 w .. 64 w + 63``."""
    word, bit = divmod(slot, 64)
    return f"coalesce(shiftright({mask}{word}, {bit}) & 1 = 1, false)"


def _mask(condition: str, word: int) -> str:
    """A bit per slot whose rows meet ``condition`` (SQL aggregate of one word)."""
    return (
        f"bit_or(CASE WHEN {condition} AND slot DIV 64 = {word} THEN shiftleft(1L, slot % 64) END)"
    )


def cm_facts(cms_cut: DataFrame, enriched: DataFrame, plans: PlanSet) -> DataFrame:
    """Every CM in the window, one row each: its columns (``state`` decoded), the fact
    columns of :mod:`spark_audit.reevaluate.compiled` over the counted acks (``c_n{i}``:
    1 if a matching counted ack, else 0; ``c_r{i}``, ``c_m{i}``, ``c_h{j}``) for
    ``plans.slots`` slots and ``plans.probes`` probes, the per-slot bit masks (see
    :func:`slot_bit`) ``_pmask``/``_mmask`` (a matching ack, counted or not, read or
    committed by the slot's deadline: deadline misses) and ``_compmask`` (a compensation
    released to the slot's destination), ``compensated``, ``late_acks``, ``flag`` and
    ``multi`` (consumptions acked more than once), and ``n_cm``: the CMs of its
    ``(cm_key, cm_rank)``, 1 unless two CMs share a key that :func:`cm_ranks` did not
    number apart (the caller then ranks them and runs again).

    One aggregation over the CM rows and the fact rows, both partitioned by ``cm_key``,
    grouped by the CM's numeric identity ``(cm_key, cm_rank)``: no text in its keys or
    its buffers (the sender is its ``sender_code``).
    Flags are bits of a few masks rather than a column per slot: the aggregation's buffer
    per CM (and its hash table) stays narrow.
    """
    cm_rows = cms_cut.where("in_window").select(
        "cm_key",
        "cm_rank",
        "sender_code",
        "plan_id",
        "sent_us",
        *_CM_COLUMNS,
        F.lit(1).alias("is_cm"),
    )
    rows = cm_rows.unionByName(_fact_rows(enriched, plans), allowMissingColumns=True)
    # SQL text: one parse per aggregate rather than a Py4J call per expression node.
    sql = [
        "max(plan_id) AS plan_id",
        "max(sent_us) AS sent_us",
        "max(sender_code) AS sender_code",
        "sum(is_cm) AS n_cm",
        *(f"max({name}) AS {name}" for name in _CM_COLUMNS),
    ]
    for i in range(plans.slots):
        sql += [
            f"min(CASE WHEN slot = {i} THEN r_c END) AS c_r{i}",
            f"min(CASE WHEN slot = {i} THEN m_c END) AS c_m{i}",
        ]
    sql += [f"count(h{j}) AS c_h{j}" for j in range(plans.probes)]
    words = range(-(-plans.slots // 64))
    sql += [f"{_mask('n_c > 0', w)} AS _cmask{w}" for w in words]
    sql += [
        f"{_mask(f'{flag} = 1', w)} AS {mask}{w}" for flag, mask in MASKS.items() for w in words
    ]
    sql += [
        f"sum(CASE WHEN NOT topic AND slot = {i} THEN n_wf END) AS _wf{i}"
        for i in range(plans.slots)
    ]
    sql += [
        "max(comp) AS compensated",
        "sum(late) AS late_acks",
        "max(flag) AS flag",
        "count(CASE WHEN topic AND n_wf > 1 THEN 1 END) AS _multi_topic",
    ]
    aggregates = [F.expr(text) for text in sql]
    per_cm = rows.groupBy("cm_key", "cm_rank").agg(*aggregates).where(F.col("n_cm") >= 1)
    repeated = "".join(f" + CASE WHEN _wf{i} > 1 THEN 1 ELSE 0 END" for i in range(plans.slots))
    counts = [
        F.expr(f"CAST({slot_bit('_cmask', i)} AS INT)").alias(f"c_n{i}") for i in range(plans.slots)
    ]
    return per_cm.select(
        "*",
        *counts,
        state_name(F.col("state_code")).alias("state"),
        F.expr(f"_multi_topic{repeated}").alias("multi"),
        F.coalesce(F.col("late_acks"), F.lit(0)).alias("_late"),
    ).drop(
        "_multi_topic",
        "state_code",
        *(f"_cmask{w}" for w in words),
        *(f"_wf{i}" for i in range(plans.slots)),
    )


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
    """Every CM in the window (:func:`cm_facts`) with its verdicts, anomalies and
    destination facts.

    ``python``: ``cm_key, cm_rank, py_verdict, py_verdict_all, py_reasons, py_error`` of the CMs
    that ``evaluate`` judges (:func:`spark_audit.reevaluate.fallback.python_verdicts`).
    ``verdict_with_late``: with late acks, the verdict over every ack where ``evaluate``
    judged the CM (else null: the driver judges those few CMs, see
    :func:`spark_audit.job.run_audit`). Per slot ``i`` (the plan's destination
    ``leaf_names[i]``): ``d_pm{i}``/``d_cm{i}`` pickup/processing deadline missed (null
    unless the CM's evaluation deadline passed by ``until``), ``d_comp{i}`` compensation
    released to it (null past the plan's slots).
    """
    plan_columns = [
        "valid",
        "native",
        "skel_id",
        "error",
        "eval_window_ms",
        "leaf_names",
        "leaf_pickup_ms",
        "leaf_process_ms",
        "node_pickup_ms",
        "node_process_ms",
        "node_min_pickup",
        "node_max_pickup",
        "node_min_process",
        "node_max_process",
    ]
    joined = facts if python is None else facts.join(python, ["cm_key", "cm_rank"], "left")
    joined = joined.join(plans.lookup(*plan_columns), "plan_id", "left")
    if python is None:
        joined = joined.select(
            "*",
            *(
                F.lit(None).cast(kind).alias(name)
                for name, kind in (
                    ("py_verdict", "string"),
                    ("py_verdict_all", "string"),
                    ("py_reasons", "array<string>"),
                    ("py_error", "string"),
                )
            ),
        )
    at_us = _us("effective_at")
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
    valued = staged.selectExpr("*", f"CASE WHEN decided AND _native THEN {value} END AS _value")
    decided = F.col("decided")
    recomputed = (
        F.when(~decided | ~F.col("_valid"), F.lit(None))
        .when(F.col("_native"), F.expr(verdict_name("_value")))
        .otherwise(F.col("py_verdict"))
    )
    # With late acks, the verdict over every ack: ``evaluate``'s for the CMs it judges;
    # for the compiled ones the driver fills it in (they are few, see job._late_effects).
    with_late = F.when(
        decided & F.col("_valid") & ~F.col("_native") & (F.col("_late") > 0),
        F.col("py_verdict_all"),
    )
    path = (
        F.when(~F.col("_valid"), F.lit("invalid"))
        .when(F.col("_native"), F.lit("native"))
        .otherwise(F.lit("python"))
    )
    error = F.when(
        ~F.col("_valid"), F.coalesce(F.col("error"), F.lit("condition does not decode"))
    ).when(~F.col("_native"), F.col("py_error"))
    stale = F.lit(False)
    if until is not None:
        limit = F.lit(until - stale_grace)
        stale = (F.col("state") == "pending") & (F.col("evaluation_deadline") < limit)
    # Per slot, in SQL text (one parse per column): a deadline is missed only once final.
    final = "_final_deadline"
    slots: list[Column] = []
    for i in range(plans.slots):
        present = f"_valid AND get(leaf_names, {i}) IS NOT NULL"

        def missed(kind: str, mask: str, present: str = present, i: int = i) -> Column:
            ms = f"get(leaf_{kind}_ms, {i})"
            on_time = slot_bit(mask, i)
            return F.expr(
                f"CASE WHEN {present} AND {final} AND {ms} IS NOT NULL THEN NOT {on_time} END"
            )

        slots += [
            missed("pickup", MASKS["on_time_pickup"]).alias(f"d_pm{i}"),
            missed("process", MASKS["on_time_process"]).alias(f"d_cm{i}"),
            F.expr(f"CASE WHEN {present} THEN {slot_bit(MASKS['comp'], i)} END").alias(
                f"d_comp{i}"
            ),
        ]
    valued = valued.withColumn(
        final,
        F.col("evaluation_deadline") <= F.lit(until) if until is not None else F.lit(True),
    )
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
        recomputed.alias("recomputed_verdict"),
        path.alias("path"),
        error.alias("error"),
        F.col("_late").alias("late_acks"),
        (F.coalesce(F.col("flag"), F.lit(0)) == 1).alias("flagged"),
        with_late.alias("verdict_with_late"),
        F.coalesce(F.col("multi"), F.lit(0)).alias("multi"),
        (F.coalesce(F.col("compensated"), F.lit(0)) == 1).alias("compensated"),
        stale.alias("stale"),
        *slots,
    ).withColumn("agrees", F.coalesce(F.col("recomputed_verdict") == F.col("state"), F.lit(False)))
