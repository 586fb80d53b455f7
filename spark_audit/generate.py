"""Synthetic sender-store logs, generated with Spark (``spark.range`` + expressions).

Writes the Parquet layout of ``condmsg export`` (plus ``injected.json``) and returns the
:class:`Injected` counts, so tests and benchmarks can assert exact detection.

How a history is made (all randomness is a hash of the row id and the seed, so the output
does not depend on partitioning):

* CM ``i`` is sent at ``start + i * interval``; its template (``spark_audit.templates``)
  is drawn by weight. Every consumption slot of the template is acked with probability
  ``p_ack``, transactionally with ``p_commit``; pickup and processing latencies are
  exponential (3 % of pickups six times slower); relay lag is 1 ms + exponential(30 ms),
  at most 200 ms. A receiver in ``skewed_receivers`` stamps its acks ``offset`` ms off.
* The evaluator decides each CM at ``E + ack_grace + 1..51 ms`` (``E`` the evaluation
  deadline) with ``effective_at = decided_at - ack_grace``; acks that would reach it only
  after that are dropped (their reader never acked), so every natural ack is counted. The
  stored verdict is the audit's own re-evaluation over those acks (which the hypothesis
  tests prove equal to ``condmsg.evaluate``; the small-scale tests re-check it against
  ``evaluate`` directly). A decision after ``until`` is not stored yet (pending).
* Injected, with exact counts: wrong verdicts (stored verdict flipped), late acks received
  after the decision (harmless: a late read of a flight CM; verdict-changing: an in-time
  read received too late), duplicate-ack anomalies, orphan acks (in the ack table and as
  ``unknown_cm`` anomalies), second acks for an already acked queue copy, and CMs left
  pending long after their evaluation deadline.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from condmsg.archive.layout import write_manifest
from condmsg.core.condition_codec import condition_to_json
from condmsg.core.timeutil import to_epoch_us, to_ms
from spark_audit.generate_inject import inject
from spark_audit.generate_spec import GenerateSpec, uniform
from spark_audit.reevaluate.recompute import recompute
from spark_audit.templates import Template


@dataclass(frozen=True, slots=True, kw_only=True)
class Injected:
    """What was generated and injected (written as ``injected.json``)."""

    cms: int
    acks: int
    until: str
    wrong_verdicts: int
    late_harmless: int
    late_changing: int
    duplicates: int
    orphans: int
    multiple_consumptions: int
    stale_pending: int
    skewed_receivers: dict[str, int]


def _exp(u: Column, mean_ms: Column) -> Column:
    return -F.log(F.lit(1.0) - u) * mean_ms


def _uuid(h1: Column, h2: Column) -> Column:
    hexed = F.concat(F.lpad(F.lower(F.hex(h1)), 16, "0"), F.lpad(F.lower(F.hex(h2)), 16, "0"))
    return F.concat_ws(
        "-",
        F.substring(hexed, 1, 8),
        F.substring(hexed, 9, 4),
        F.substring(hexed, 13, 4),
        F.substring(hexed, 17, 4),
        F.substring(hexed, 21, 12),
    )


def _templates_frame(spark: SparkSession, spec: GenerateSpec) -> DataFrame:
    rows = []
    for index, t in enumerate(spec.templates):
        requires = t.requires()
        copies = sorted({(d, r if not topic else None, topic) for d, r, topic in t.slots()})
        exchange = {leaf.name: leaf.exchange or "" for leaf in t.condition.destinations()}
        rows.append(
            (
                index,
                t.name,
                condition_to_json(t.condition),
                to_ms(t.condition.evaluation_window()),
                [(d, r, topic) for d, r, topic in t.slots()],
                [(d, r, exchange[d], requires[d]) for d, r, _ in copies],
                float(t.p_ack),
                float(t.p_commit),
                float(t.pickup_mean_ms),
                float(t.work_mean_ms),
            )
        )
    schema = (
        "template int, template_name string, condition_json string, eval_ms long, "
        "slots array<struct<destination:string,recipient:string,is_topic:boolean>>, "
        "copies array<struct<destination:string,recipient:string,exchange:string,"
        "requires:string>>, p_ack double, p_commit double, pickup_mean double, "
        "work_mean double"
    )
    return spark.createDataFrame(rows, schema)


def _pick_template(u: Column, templates: tuple[Template, ...]) -> Column:
    total = sum(t.weight for t in templates)
    expr: Column | None = None
    bound = 0.0
    for index, t in enumerate(templates[:-1]):
        bound += t.weight / total
        expr = F.when(u < bound, F.lit(index)) if expr is None else expr.when(u < bound, index)
    last = F.lit(len(templates) - 1)
    return last if expr is None else expr.otherwise(last)


def _cms(spark: SparkSession, spec: GenerateSpec) -> DataFrame:
    seed, start_us = spec.seed, to_epoch_us(spec.start)
    ids = spark.range(0, spec.cms, numPartitions=spec.partitions or None)
    grace_us = spec.ack_grace_ms * 1000
    base = ids.select(
        "id",
        _uuid(
            F.xxhash64("id", F.lit(seed), F.lit(1)), F.xxhash64("id", F.lit(seed), F.lit(2))
        ).alias("cm_id"),
        _pick_template(uniform(F.col("id"), seed, 3), spec.templates).alias("template"),
        F.concat(
            F.lit("sender-"), F.pmod(F.xxhash64("id", F.lit(seed), F.lit(4)), F.lit(spec.senders))
        ).alias("sender"),
        (F.lit(start_us) + F.col("id") * F.lit(spec.interval_ms * 1000)).alias("sent_us"),
    )
    joined = base.join(F.broadcast(_templates_frame(spark, spec)), "template")
    return joined.withColumn("e_us", F.col("sent_us") + F.col("eval_ms") * 1000).withColumn(
        "decided_us",
        F.col("e_us")
        + F.lit(grace_us + 1000)
        + F.floor(uniform(F.col("id"), seed, 5) * F.lit(50_000)).cast("long"),
    )


def _natural_acks(cms: DataFrame, spec: GenerateSpec) -> DataFrame:
    seed = spec.seed
    skew = (
        F.create_map(*[F.lit(x) for kv in spec.skewed_receivers.items() for x in kv])
        if spec.skewed_receivers
        else None
    )
    slots = cms.select(
        "id",
        "cm_id",
        "sent_us",
        "e_us",
        "p_ack",
        "p_commit",
        "pickup_mean",
        "work_mean",
        F.posexplode("slots").alias("pos", "slot"),
    )

    def u(salt: int) -> Column:
        return uniform(F.col("id"), F.col("pos"), seed, salt)

    pickup = _exp(u(12), F.col("pickup_mean")) * F.when(u(13) < 0.03, 6.0).otherwise(1.0)
    work = _exp(u(14), F.col("work_mean"))
    relay = F.least(F.lit(200.0), F.lit(1.0) + _exp(u(15), F.lit(30.0)))
    receiver = F.concat_ws("-", F.lit("rcv"), F.col("slot.destination"), F.col("slot.recipient"))
    made = slots.where(u(10) < F.col("p_ack")).select(
        "cm_id",
        "pos",
        "e_us",
        F.col("slot.destination").alias("destination"),
        F.col("slot.recipient").alias("recipient"),
        receiver.alias("receiver"),
        (u(11) < F.col("p_commit")).alias("is_commit"),
        (F.col("sent_us") + (pickup * 1000).cast("long")).alias("read_us"),
        (work * 1000).cast("long").alias("work_us"),
        (relay * 1000).cast("long").alias("relay_us"),
    )
    offset = F.coalesce(skew[F.col("receiver")], F.lit(0)) * 1000 if skew is not None else F.lit(0)
    commit_us = F.when(F.col("is_commit"), F.col("read_us") + F.col("work_us"))
    received_us = F.coalesce(commit_us, F.col("read_us")) + F.col("relay_us")
    return (
        made.select(
            F.concat_ws("-", F.col("cm_id"), F.col("pos")).alias("ack_id"),
            "cm_id",
            "destination",
            "recipient",
            "receiver",
            F.when(F.col("is_commit"), F.lit("commit")).otherwise(F.lit("read")).alias("kind"),
            F.timestamp_micros(F.col("read_us") + offset.cast("long")).alias("read_at"),
            F.timestamp_micros(commit_us + offset.cast("long")).alias("committed_at"),
            F.timestamp_micros(received_us).alias("received_at"),
            F.lit("counted").alias("status"),
            received_us.alias("received_us"),
            "e_us",
        )
        # An ack that would reach the evaluator only after its decision is not made.
        .where(F.col("received_us") <= F.col("e_us") + F.lit(spec.ack_grace_ms * 1000))
        .drop("received_us", "e_us")
    )


def _stored_verdicts(cms: DataFrame, acks: DataFrame, spec: GenerateSpec) -> DataFrame:
    cases = cms.select(
        "cm_id",
        "condition_json",
        F.timestamp_micros("sent_us").alias("sent_at"),
        F.timestamp_micros(F.col("decided_us") - spec.ack_grace_ms * 1000).alias("at"),
    )
    return recompute(cases, acks).select("cm_id", "verdict")


def generate(spark: SparkSession, spec: GenerateSpec, out: str | Path) -> Injected:
    """Generate ``spec`` into ``out`` (the Parquet layout of ``condmsg export``)."""
    directory = Path(out)
    level = StorageLevel.MEMORY_AND_DISK
    cms = _cms(spark, spec).persist(level)
    acks = _natural_acks(cms, spec).persist(level)
    verdicts = _stored_verdicts(cms, acks, spec)
    cms = cms.join(verdicts, "cm_id").persist(level)
    tables, counts = inject(spark, spec, cms, acks)
    rows: dict[str, int] = {}
    for name, frame in tables.items():
        frame.write.mode("overwrite").parquet(str(directory / name))
        rows[name] = spark.read.parquet(str(directory / name)).count()
    injected = Injected(
        cms=spec.cms,
        acks=rows["acks"],
        until=spec.until.isoformat(),
        skewed_receivers=dict(spec.skewed_receivers),
        **counts,
    )
    write_manifest(
        directory,
        source=f"spark_audit.generate (seed {spec.seed})",
        since=None,
        until=spec.until,
        rows=rows,
    )
    (directory / "injected.json").write_text(json.dumps(asdict(injected), indent=2) + "\n")
    for frame in (cms, acks):
        frame.unpersist()
    return injected
