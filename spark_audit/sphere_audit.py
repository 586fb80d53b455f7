"""The audit's Dependency-Sphere step: the counts of ``summary.json``'s ``spheres`` and
the detail tables ``sphere_discrepancies`` (decided spheres whose stored verdict the
sphere rules over their members do not reproduce, or whose recorded member count is not
the number of members found) and ``sphere_early_releases`` (member
compensations released before their sphere was decided).

Spheres are few beside CMs: one small job counts them, and only an input that has some
is cut and joined with its CMs; without spheres both tables are written empty, with
their schemas (:data:`spark_audit.output.SPHERE_SCHEMAS`), and nothing more is planned.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_audit.output import SPHERE_SCHEMAS, TableWriter
from spark_audit.readers import AuditInput, Window, apply_window, cut_spheres
from spark_audit.transforms.spheres import (
    JUDGED_COLUMNS,
    SATISFIED,
    VIOLATED,
    early_releases,
    judge_spheres,
)

DISCREPANCIES = "sphere_discrepancies"
EARLY_RELEASES = "sphere_early_releases"


def write_sphere_tables(data: AuditInput, window: Window, writer: TableWriter) -> dict[str, int]:
    """The spheres of ``data`` in ``window`` judged and checked; writes the detail tables
    and returns the counts: ``spheres`` (in the window), ``decided``, ``satisfied``,
    ``violated`` (as stored), ``disagreements``, ``member_mismatches`` and
    ``early_releases``."""
    counts = _one_row(
        cut_spheres(data.spheres, window).agg(
            F.count(F.lit(1)).alias("spheres"),
            F.count(F.when(F.col("state").isin(SATISFIED, VIOLATED), True)).alias("decided"),
            F.count(F.when(F.col("state") == SATISFIED, True)).alias("satisfied"),
            F.count(F.when(F.col("state") == VIOLATED, True)).alias("violated"),
        )
    )
    if not counts["spheres"]:
        for name in (DISCREPANCIES, EARLY_RELEASES):
            writer.arrow(name, SPHERE_SCHEMAS[name].empty_table())
        return {**counts, "disagreements": 0, "member_mismatches": 0, "early_releases": 0}
    cut = apply_window(data, window)
    judged = judge_spheres(cut.spheres, cut.cms)
    disagrees = ~F.col("agrees")
    # Every member of a decided sphere was sent before its decision, in the window: one
    # recorded but not found is a member CM missing from the log.
    incomplete = F.col("members_recorded") != F.col("members_found")
    wrong = judged.where(disagrees | incomplete).select(*JUDGED_COLUMNS)
    early = early_releases(cut.spheres, cut.cms, cut.compensations)
    # Both detail tables counted by one job.
    found = _one_row(
        judged.agg(
            F.count(F.when(disagrees, True)).alias("disagreements"),
            F.count(F.when(incomplete, True)).alias("member_mismatches"),
            F.count(F.when(disagrees | incomplete, True)).alias("listed"),
        ).crossJoin(early.agg(F.count(F.lit(1)).alias("early_releases")))
    )
    listed = found.pop("listed")
    writer.frames(
        {DISCREPANCIES: (wrong, listed), EARLY_RELEASES: (early, found["early_releases"])}
    )
    return {**counts, **found}


def _one_row(aggregation: DataFrame) -> dict[str, int]:
    """The counts of a global aggregation (which has exactly one row)."""
    row = aggregation.first()
    assert row is not None
    return {name: int(value or 0) for name, value in row.asDict().items()}
