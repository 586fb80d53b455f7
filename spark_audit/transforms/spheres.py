"""Dependency-Spheres re-judged from their members' recorded decisions, and the member
compensations released before their sphere was decided (pure ``DataFrame -> DataFrame``).

The inputs are the cut at the audit's window (:func:`spark_audit.readers.apply_window`).
A sphere decided by ``until`` was judged over its members' decisions taken no later than
its own, so all of them are in the cut; a member decided after its sphere cannot turn the
verdict, since its effective instant is past the sphere's deadline (the evaluator decides
a sphere by its timeout only once the ack grace after the deadline has passed).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from condmsg.core.store_values import CmState, SphereState

SATISFIED, VIOLATED = SphereState.SATISFIED.value, SphereState.VIOLATED.value
#: The columns of :func:`judge_spheres` (the ``sphere_discrepancies`` table's).
JUDGED_COLUMNS = (
    "sphere_id",
    "sender",
    "stored_verdict",
    "recomputed_verdict",
    "agrees",
    "recomputed_reason",
    "deadline",
    "committed_at",
    "aborted_at",
    "decided_at",
    "effective_at",
    "members_recorded",
    "members_found",
    "members_satisfied_in_time",
    "members_violated",
    "stored_reasons_json",
)


def member_counts(spheres: DataFrame, cms: DataFrame) -> DataFrame:
    """Per sphere of ``spheres`` with members among ``cms``: ``members_found``,
    ``members_violated`` (decided ``violated``) and ``members_satisfied_in_time``
    (decided ``satisfied`` at an effective instant at or before the sphere's deadline)."""
    members = cms.where(F.col("sphere_id").isNotNull()).select("sphere_id", "state", "effective_at")
    decided = F.col("effective_at").isNotNull()
    violated = decided & (F.col("state") == CmState.VIOLATED.value)
    in_time = (
        decided
        & (F.col("state") == CmState.SATISFIED.value)
        & (F.col("effective_at") <= F.col("deadline"))
    )
    return (
        members.join(spheres.select("sphere_id", "deadline"), "sphere_id")
        .groupBy("sphere_id")
        .agg(
            F.count(F.lit(1)).alias("members_found"),
            F.count(F.when(violated, True)).alias("members_violated"),
            F.count(F.when(in_time, True)).alias("members_satisfied_in_time"),
        )
    )


def sphere_verdict() -> Column:
    """The verdict of a sphere judged after its deadline, over the columns ``aborted_at,
    committed_at, deadline`` and :func:`member_counts`'.

    These are the rules of ``condmsg.core.sphere_evaluation.judge_sphere`` (which the evaluator
    decides with) at an instant past the deadline: satisfied iff not aborted, committed by
    the deadline, no member violated and every member satisfied by the deadline; else
    violated. ``tests/spark/test_spheres.py`` compares the two on hand-built cases.
    """
    committed = F.coalesce(F.col("committed_at") <= F.col("deadline"), F.lit(False))
    satisfied = (
        F.col("aborted_at").isNull()
        & committed
        & (F.col("members_violated") == 0)
        & (F.col("members_satisfied_in_time") == F.col("members_found"))
    )
    return F.when(satisfied, F.lit(SATISFIED)).otherwise(F.lit(VIOLATED))


def _reason() -> Column:
    """Why :func:`sphere_verdict` decided as it did, in the order of ``judge_sphere``'s
    rules."""
    waiting = F.col("members_found") - F.col("members_satisfied_in_time")
    return (
        F.when(F.col("members_violated") > 0, F.lit("a member violated"))
        .when(F.col("aborted_at").isNotNull(), F.lit("aborted"))
        .when(
            ~F.coalesce(F.col("committed_at") <= F.col("deadline"), F.lit(False)),
            F.lit("not committed by the deadline"),
        )
        .when(
            waiting > 0,
            F.format_string(
                "%d %s not satisfied by the deadline",
                waiting,
                F.when(waiting == 1, F.lit("member")).otherwise(F.lit("members")),
            ),
        )
        .when(F.col("members_found") == 1, F.lit("committed with its only member satisfied"))
        .otherwise(F.format_string("committed with all %d members satisfied", "members_found"))
    )


def judge_spheres(spheres: DataFrame, cms: DataFrame) -> DataFrame:
    """Every decided sphere of ``spheres`` (state ``satisfied`` or ``violated``) judged
    again from its members among ``cms``, with :data:`JUDGED_COLUMNS`: its stored and
    recomputed verdicts, whether they agree, and the evidence."""
    decided = spheres.where(F.col("state").isin(SATISFIED, VIOLATED))
    counts = member_counts(decided, cms)
    counted = ["members_found", "members_violated", "members_satisfied_in_time"]
    judged = (
        decided.join(counts, "sphere_id", "left")
        .fillna(0, subset=counted)
        .withColumn("recomputed_verdict", sphere_verdict())
    )
    return judged.select(
        "sphere_id",
        "sender",
        F.col("state").alias("stored_verdict"),
        "recomputed_verdict",
        (F.col("state") == F.col("recomputed_verdict")).alias("agrees"),
        _reason().alias("recomputed_reason"),
        "deadline",
        "committed_at",
        "aborted_at",
        "decided_at",
        "effective_at",
        F.col("members").alias("members_recorded"),
        "members_found",
        "members_satisfied_in_time",
        "members_violated",
        F.col("reasons_json").alias("stored_reasons_json"),
    )


def early_releases(spheres: DataFrame, cms: DataFrame, compensations: DataFrame) -> DataFrame:
    """The compensations of sphere members released before their sphere was decided (or
    released while it is undecided): the sphere's verdict, not the member's, releases
    them, in the transaction that records it. Members of spheres not in ``spheres`` (an
    archive without its spheres) are not judged. Columns: ``sphere_id, cm_id,
    destination, released_at, sphere_decided_at``."""
    members = cms.where(F.col("sphere_id").isNotNull()).select("cm_id", "sphere_id")
    released = compensations.where(F.col("released_at").isNotNull())
    decided = spheres.select("sphere_id", F.col("decided_at").alias("sphere_decided_at"))
    early = F.col("sphere_decided_at").isNull() | (
        F.col("released_at") < F.col("sphere_decided_at")
    )
    return (
        released.select("cm_id", "destination", "released_at")
        .join(members, "cm_id")
        .join(decided, "sphere_id")
        .where(early)
        .select("sphere_id", "cm_id", "destination", "released_at", "sphere_decided_at")
    )
