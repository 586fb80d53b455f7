"""The boolean columns of the enriched acks packed as the bits of one integer, and back:
the form the audit caches the acks in."""

from __future__ import annotations

from pyspark.sql import DataFrame

#: The boolean columns of :func:`spark_audit.transforms.enrich.enrich_acks` that
#: :func:`pack_flags` stores as bits of one ``flags`` integer (two bits each: the value
#: and whether it is null).
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
    reader of the cache sees
    :func:`~spark_audit.transforms.enrich.enrich_acks`' columns.
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
