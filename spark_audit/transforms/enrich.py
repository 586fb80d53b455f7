"""The audit's shared frames, built with one shuffle of the CMs and one of the acks.

1. :func:`cut_cms`: every CM of the source, one row each, hash-partitioned by ``cm_key``
   (:func:`cm_key`) with its ``plan_id`` and whether it is in the window (the cut, DESIGN
   section 6). CMs outside the window stay (without them an ack of theirs would look like
   an orphan).
2. :func:`enrich_acks`: every ack in the cut, and every released compensation, with its
   CM's columns and the destination *slot* of its CM's plan (the acks are shuffled once to
   the CMs' partitioning; the join itself moves nothing more). The audit caches it
   without text: the CM as the numbers ``(cm_key, cm_rank)``, ``kind`` and ``status`` as
   codes, the destination as its code in the plans' destinations (and its flags packed,
   :mod:`spark_audit.transforms.ack_flags`).

Over these, :mod:`spark_audit.transforms.facts` aggregates each CM's facts and
:mod:`spark_audit.transforms.judge` judges it.

Instants are integer microseconds (``*_us``); durations are derived where they are used.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from condmsg.archive.layout import AckStatus
from spark_audit.readers import Window, decided_after, seen_in, sent_in
from spark_audit.reevaluate import well_formed
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


def unix_us(column: str) -> Column:
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
        unix_us("sent_at").alias("sent_us"),
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
    this frame is cheaper to build: text columns are the widest, see docs/audit.md).
    """
    joined = _join_cms(_coded(_events(acks, compensations, window)), cms_cut)
    enriched = _on_time(_ack_columns(plans.with_leaves(joined.where(_in_cut(window)))))
    other = F.when(F.col("dest_code").isNull(), F.col("destination"))
    kept = [c for c in enriched.columns if text or c not in TEXT_COLUMNS]
    return enriched.select(*kept, other.alias("other_destination"))


def _events(acks: DataFrame, compensations: DataFrame, window: Window | None) -> DataFrame:
    """The acks received by ``until`` and the compensations released by then, in one
    frame (a compensation's release is its ``received_at``; ``is_comp`` tells them apart)
    so that one join with the CMs serves both."""
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
    if window is not None:
        events = events.where(F.col("received_at") <= F.lit(window.until))
    return events


def _coded(events: DataFrame) -> DataFrame:
    """``events`` with what the ack alone decides, computed before the shuffle (without
    ``text``, its ``kind`` and ``status`` then do not travel): ``cm_key``, ``wf``,
    ``commit`` and ``status_code``."""
    return events.select(
        "*",
        cm_key(),
        (F.coalesce(well_formed(), F.lit(False)) & ~F.col("is_comp")).alias("wf"),
        (F.col("kind") == "commit").alias("commit"),
        status_code(F.col("status")).alias("status_code"),
    )


def _join_cms(coded: DataFrame, cms_cut: DataFrame) -> DataFrame:
    """Each event with its CM's columns (null for an orphan): the acks' one shuffle, to
    the CMs' partitioning, joined on ``cm_key`` with the ids compared beside it."""
    cms = cms_cut.select(
        F.col("cm_key").alias("_cm_key"),
        F.col("cm_id").alias("_cm_id"),
        "cm_rank",
        "in_window",
        "sent_us",
        "plan_id",
        unix_us("decided_at").alias("decided_us"),
    )
    on_cm = (F.col("cm_key") == F.col("_cm_key")) & same_text("cm_id", "_cm_id")
    return coded.join(cms.hint("shuffle_hash"), on_cm, "left")


def _in_cut(window: Window | None) -> Column:
    """The joined events in the cut: those of CMs in the window, and orphans (no CM in
    the source at all) received in the window."""
    orphan_ok: Column = F.lit(True)
    if window is not None:
        orphan_ok = seen_in(window, "received_at")
    known = F.col("in_window").isNotNull()
    return F.coalesce(F.col("in_window"), F.lit(False)) | (~known & orphan_ok & ~F.col("is_comp"))


def _ack_columns(with_leaves: DataFrame) -> DataFrame:
    """The columns of :func:`enrich_acks` from the joined events and their plan leaves
    (:meth:`PlanSet.with_leaves`), instants as microseconds."""
    known = F.col("in_window").isNotNull()
    return with_leaves.select(
        "cm_key",
        "cm_rank",
        "ack_id",
        "cm_id",
        "destination",
        "recipient",
        "receiver",
        "kind",
        "status",
        unix_us("read_at").alias("read_us"),
        unix_us("committed_at").alias("committed_us"),
        unix_us("received_at").alias("received_us"),
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


def _on_time(frame: DataFrame) -> DataFrame:
    """``matched`` (the ack counts for its destination: the recipient matches where the
    destination names one) and ``on_time_pickup``/``on_time_process`` (matched, and
    read/committed by the destination's tightest deadline)."""
    return (
        frame.select(
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


#: The text columns :func:`enrich_acks` leaves out with ``text=False``.
TEXT_COLUMNS = ("ack_id", "cm_id", "destination", "kind", "status")


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
