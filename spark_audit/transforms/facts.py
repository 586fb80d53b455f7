"""Each CM's facts: one aggregation over the CM rows and the ack rows together.

:func:`cm_facts` gives, per CM in the window, its columns and the facts its verdict and
its deadline misses are judged from (:mod:`spark_audit.reevaluate.compiled`): acks of a
topic destination grouped per recipient first, all on the shared frames' partitioning
(:mod:`spark_audit.transforms.enrich`), so nothing is shuffled and no join is needed (a
CM without acks has its own row), grouped by the CM's numbers.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.transforms.conditions import PlanSet
from spark_audit.transforms.enrich import (
    CHANGES_VERDICT_CODE,
    commit_us_if,
    consumer,
    counted,
    state_name,
)

#: The per-ack deadline flags of :func:`spark_audit.transforms.enrich.enrich_acks`, and
#: their per-CM bit masks.
ON_TIME = ("on_time_pickup", "on_time_process")
MASKS = {"on_time_pickup": "_pmask", "on_time_process": "_mmask", "comp": "_compmask"}
_CM_COLUMNS = ("sent_at", "state_code", "decided_at", "effective_at", "evaluation_deadline")
_FACT_KEYS = ("cm_key", "cm_rank", "plan_id", "sent_us", "slot")


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
    ``(cm_key, cm_rank)``, 1 unless two CMs share a key that
    :func:`~spark_audit.transforms.enrich.cm_ranks` did not number apart (the caller then
    ranks them and runs again).

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
    aggregates = [F.expr(text) for text in _per_cm_sql(plans)]
    per_cm = rows.groupBy("cm_key", "cm_rank").agg(*aggregates).where(F.col("n_cm") >= 1)
    return _decoded(per_cm, plans)


def _per_cm_sql(plans: PlanSet) -> list[str]:
    """The per-CM aggregates of :func:`cm_facts`, as SQL text: one parse per aggregate
    rather than a Py4J call per expression node."""
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
    return sql


def _decoded(per_cm: DataFrame, plans: PlanSet) -> DataFrame:
    """The aggregated CMs with the columns derived from the aggregates (``c_n{i}`` from
    the counted mask, ``state``, ``multi``, ``_late``), the intermediate ones dropped."""
    words = range(-(-plans.slots // 64))
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


def _fact_rows(enriched: DataFrame, plans: PlanSet) -> DataFrame:
    """The ack and compensation rows :func:`cm_facts` aggregates (acks' partitioning).

    An ack of a queue destination (or of none in the tree) is its own row; the acks of a
    topic destination are first grouped per recipient (``topic`` rows), since a topic is
    judged per recipient. Per row: ``n_wf`` acks; over the matching counted acks: ``n_c``
    acks, ``r_c`` first read, ``m_c`` first commit; ``on_time_pickup``/``on_time_process``
    (1 if a matching ack, counted or not, was in time, see
    :func:`spark_audit.transforms.enrich.enrich_acks`);
    ``late`` acks not counted, ``flag`` (one is labelled ``changes_verdict``), ``comp`` (a
    compensation released to the slot's destination); on a topic row, ``h{j}`` (1 if the
    recipient was in time for the plan's probe ``j``, else null).
    """
    rows = enriched.where(F.col("known") & F.col("wf"))
    is_counted = counted()
    taken = F.col("matched") & is_counted
    late = F.when(~is_counted, F.lit(1)).otherwise(F.lit(0)).cast("long")
    flag = (F.col("status_code") == CHANGES_VERDICT_CODE).cast("int")
    single, grouped = _fact_columns(taken)
    # The queue acks and the compensations in one scan, the topic acks grouped per
    # recipient in another.
    acks = _queue_rows(enriched, single, late, flag)
    recipients = (
        rows.where(F.col("topic"))
        .groupBy(*_FACT_KEYS, consumer())
        .agg(*grouped, F.sum(late).alias("late"), F.max(flag).alias("flag"))
        .drop("consumer")
        .withColumn("topic", F.lit(True))
        .withColumn("comp", F.lit(0))
    )
    if plans.probes:
        recipients = _with_probe_hits(recipients, plans)
    return acks.unionByName(recipients, allowMissingColumns=True)


def _fact_columns(taken: Column) -> tuple[list[tuple[str, Column]], list[Column]]:
    """The fact columns of one ack (``single``: name and value) and their aggregates over
    a recipient's acks (``grouped``); ``taken``: a matching counted ack."""
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
    return single, grouped


def _queue_rows(
    enriched: DataFrame, single: list[tuple[str, Column]], late: Column, flag: Column
) -> DataFrame:
    """The queue acks and the compensations in one scan (a compensation row has only its
    slot and ``comp``)."""
    ack = ~F.col("is_comp")
    return enriched.where(
        F.col("known") & ((F.col("wf") & ~F.col("topic")) | F.col("is_comp"))
    ).select(
        *_FACT_KEYS,
        *(F.when(ack, column).alias(name) for name, column in single),
        F.when(ack, late).alias("late"),
        F.when(ack, flag).alias("flag"),
        F.when(ack, F.lit(False)).alias("topic"),
        F.when(ack, F.lit(0)).otherwise(F.lit(1)).alias("comp"),
    )


def _with_probe_hits(recipients: DataFrame, plans: PlanSet) -> DataFrame:
    """The topic rows with ``h{j}`` per probe of the plan: the probes' parameters only on
    the topic rows (a few per cent of the rows), rather than the plan's arrays on every
    row of the per-CM aggregation."""
    probes = plans.lookup("probe_slot", "probe_process", "probe_ms")
    hits = []
    for j in range(plans.probes):
        first = f"CASE WHEN get(probe_process, {j}) THEN m_c ELSE r_c END"
        deadline = f"sent_us + get(probe_ms, {j}) * 1000"
        hit = f"slot = get(probe_slot, {j}) AND {first} <= {deadline}"
        hits.append(f"CASE WHEN {hit} THEN 1 END AS h{j}")
    return (
        recipients.join(probes, "plan_id", "left")
        .selectExpr("*", *hits)
        .drop("probe_slot", "probe_process", "probe_ms")
    )
