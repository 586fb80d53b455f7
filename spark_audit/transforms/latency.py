"""Latency percentiles and distributions, from one histogram pass over the acks.

Every latency of every well-formed ack of a known CM (integer microseconds) is counted in
a log-linear bucket: exact below 64 µs, above that 64 buckets per power of two, so a
bucket is less than 1.1 % wide; each bucket keeps its count, smallest and largest value.
Spark groups by (metric, key, bucket), a cheap hash aggregation whose result is small
(thousands of rows); the driver then merges buckets into every level of the report and
reads the percentiles off the cumulative counts:

* the ``p``-th percentile is the value of rank ``ceil(p * n)`` (nearest rank); inside its
  bucket it is interpolated linearly between the bucket's smallest and largest values by
  rank, so it is exact when the bucket holds one distinct value and otherwise off by less
  than the bucket's width (under 1.1 % of the value, under 1 µs below 64 µs);
* the histogram of the report (power-of-two millisecond bins) is a grouping key of the
  same pass, so it is exact.

Metrics (ms in the tables): pickup = read_at - sent_at, process = committed_at - sent_at
(COMMIT acks), work = committed_at - read_at, relay = received_at - the ack's own event
(committed_at for a COMMIT ack, else read_at). Pickup, process and work are keyed by
destination and recipient (levels ``recipient``, ``destination``, ``all``); relay also by
receiver (:mod:`spark_audit.transforms.skew`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_audit.transforms.anomalies import COUNTERS, counters
from spark_audit.transforms.enrich import acks_only, commit_us

PERCENTILES = (0.5, 0.9, 0.99)
METRICS = ("pickup", "process", "work", "relay")
#: Buckets per power of two (above the exact range, which is [0, SUB_BUCKETS) µs).
SUB_BUCKETS = 64
HISTOGRAM_METRICS = ("pickup", "process")
#: The metrics' codes in :func:`histogram_frame` (a small number hashes faster than a name).
CODES = {name: code for code, name in enumerate(METRICS)}

Bucket = tuple[int, int, int]  # (count, smallest µs, largest µs)


def _fine(value: str) -> str:
    """The log-linear bucket of ``value`` (µs; SQL text)."""
    bucket = (
        f"CASE WHEN abs({value}) < {SUB_BUCKETS} THEN abs({value}) "
        f"ELSE floor(log2(abs({value})) * {SUB_BUCKETS}) END"
    )
    return f"CAST(CASE WHEN {value} < 0 THEN -({bucket}) - 1 ELSE {bucket} END AS BIGINT)"


def _coarse(value: str) -> str:
    """The report's bin (SQL text): -1 negative, 0 below 1 ms, k >= 1 for [2^(k-1), 2^k) ms."""
    ms = f"({value} / 1000.0D)"
    return (
        f"CAST(CASE WHEN {ms} < 0 THEN -1 WHEN {ms} < 1 THEN 0 "
        f"ELSE CAST(floor(log2({ms})) AS INT) + 1 END AS INT)"
    )


def histogram_frame(enriched: DataFrame) -> DataFrame:
    """``metric, code1, key1, key2, key3, bin, bucket, rows, n, lo, hi, lo2, <counters>``
    over the acks (``metric``: its code in :data:`CODES`; ``bin`` only for
    :data:`HISTOGRAM_METRICS`).

    Latencies (µs) of the well-formed acks of known CMs, per :data:`METRICS` keyed by
    destination and recipient: the destination is ``code1``, its index in the plans'
    destinations (``dest_code``, see :func:`spark_audit.transforms.enrich.enrich_acks`),
    where the ack's plan names it, else its name ``key1`` (``other_destination``; a number
    hashes and compares faster than a string; :class:`Histograms` puts the names back and
    merges the rows of one name). Every ack has a ``relay`` row, also keyed by its
    receiver (``key3``): its relay lag, ``lo2`` (the smallest pickup, for the clock
    bounds) and the counts of :data:`COUNTERS` (``rows``: every ack), so the per-receiver
    figures need no other pass over the acks and no row of their own.

    Each ack is exploded over a constant array of metric codes (no per-row arrays or
    structs are built), and each entry picks its value and keys by its code.
    """
    read, sent = F.col("read_us"), F.col("sent_us")
    commit = commit_us()
    facts = F.col("known") & F.col("wf")
    counts = counters()
    values = acks_only(enriched).select(
        "other_destination",
        "dest_code",
        "recipient",
        "receiver",
        F.when(facts, read - sent).alias("_pickup"),
        F.when(facts, commit - sent).alias("_process"),
        F.when(facts, commit - read).alias("_work"),
        F.when(facts, F.col("received_us") - F.coalesce(commit, read)).alias("_relay"),
        *(
            F.coalesce(condition, F.lit(False)).cast("int").alias(f"_{name}")
            for name, condition in counts.items()
        ),
    )
    relay = CODES["relay"]
    codes = ", ".join(f"CAST({CODES[name]} AS TINYINT)" for name in METRICS)
    by_code = " ".join(f"WHEN {CODES[m]} THEN _{m}" for m in METRICS)
    exploded = values.selectExpr("*", f"explode(array({codes})) AS metric").selectExpr(
        "metric",
        "other_destination AS key1",
        "dest_code AS code1",
        "recipient AS key2",
        f"CASE WHEN metric = {relay} THEN receiver END AS key3",
        f"CASE metric {by_code} END AS v",
        f"CASE WHEN metric = {relay} THEN _pickup END AS v2",
        *(f"CASE WHEN metric = {relay} THEN _{n} END AS {n}" for n in COUNTERS),
    )
    kept = exploded.where(f"v IS NOT NULL OR metric = {relay}")
    # The report's bins only for the metrics it draws (fewer groups for the others).
    drawn = ", ".join(str(CODES[m]) for m in HISTOGRAM_METRICS)
    return kept.groupBy(
        "metric",
        "code1",
        "key1",
        "key2",
        "key3",
        F.expr(f"CASE WHEN metric IN ({drawn}) THEN {_coarse('v')} END").alias("bin"),
        F.expr(_fine("v")).alias("bucket"),
    ).agg(
        *(
            F.expr(text)
            for text in (
                "count(1) AS rows",
                "count(v) AS n",
                "min(v) AS lo",
                "max(v) AS hi",
                "min(v2) AS lo2",
                *(f"sum({n}) AS {n}" for n in COUNTERS),
            )
        )
    )


def percentile(buckets: Iterable[Bucket], p: float) -> float | None:
    """The ``p``-th percentile (ms) of the values in ``buckets`` (see the module doc)."""
    ordered = sorted(buckets, key=lambda b: b[1])
    total = sum(b[0] for b in ordered)
    if total == 0:
        return None
    permille = round(p * 1000)
    rank = max(1, (permille * total + 999) // 1000)
    seen = 0
    for count, lo, hi in ordered:
        if seen + count >= rank:
            k = rank - seen
            value = lo if count == 1 else lo + (hi - lo) * (k - 1) / (count - 1)
            return value / 1000.0
        seen += count
    return ordered[-1][2] / 1000.0


def _merge(into: dict[int, list[int]], bucket: int, n: int, lo: int, hi: int) -> None:
    found = into.get(bucket)
    if found is None:
        into[bucket] = [n, lo, hi]
    else:
        found[0] += n
        found[1] = min(found[1], lo)
        found[2] = max(found[2], hi)


def _buckets(merged: Mapping[int, list[int]]) -> list[Bucket]:
    return [(n, lo, hi) for n, lo, hi in merged.values()]


#: The latency levels: their grouping keys in :func:`histogram_frame`'s output.
LEVELS = (
    ("recipient", ("metric", "key1", "key2")),
    ("destination", ("metric", "key1")),
    ("all", ("metric",)),
)

Arrays = tuple[Any, Any, Any]  # numpy (count, smallest µs, largest µs) per bucket, by value


def _level_groups(table: pa.Table, keys: tuple[str, ...]) -> dict[tuple[Any, ...], Arrays]:
    """Per group of ``keys``: its buckets merged (pyarrow), ordered by value."""
    merged = table.group_by([*keys, "bucket"]).aggregate(
        [("n", "sum"), ("lo", "min"), ("hi", "max")]
    )
    merged = merged.sort_by([*((k, "ascending") for k in keys), ("lo_min", "ascending")])
    names = list(zip(*(merged.column(k).to_pylist() for k in keys), strict=True))
    counts, lows, highs = (merged.column(c).to_numpy() for c in ("n_sum", "lo_min", "hi_max"))
    found: dict[tuple[Any, ...], Arrays] = {}
    start = 0
    for i in range(1, len(names) + 1):
        if i == len(names) or names[i] != names[start]:
            found[names[start]] = (counts[start:i], lows[start:i], highs[start:i])
            start = i
    return found


def _percentile_of(arrays: Arrays | None, p: float) -> float | None:
    """:func:`percentile` over merged buckets ordered by value (numpy arrays)."""
    if arrays is None:
        return None
    counts, lows, highs = arrays
    cumulative = counts.cumsum()
    total = int(cumulative[-1]) if len(cumulative) else 0
    if total == 0:
        return None
    permille = round(p * 1000)
    rank = max(1, (permille * total + 999) // 1000)
    i = int(cumulative.searchsorted(rank, side="left"))
    count, lo, hi = int(counts[i]), int(lows[i]), int(highs[i])
    k = rank - (int(cumulative[i]) - count)
    value = lo if count == 1 else lo + (hi - lo) * (k - 1) / (count - 1)
    return value / 1000.0


class Histograms:
    """The collected histogram, merged per level (see :func:`histogram_frame`).

    The latency buckets are merged per level with pyarrow and read with numpy (hundreds
    of thousands of buckets at 1M acks); the relay rows are merged per receiver and bucket
    with pyarrow too, and their rows (one per receiver and bucket) folded in Python.
    """

    def __init__(self, table: pa.Table, destinations: Sequence[str] = ()) -> None:
        #: (level, destination, recipient) -> metric -> merged buckets
        self.groups: dict[tuple[str, Any, Any], dict[str, Arrays]] = defaultdict(dict)
        self.receivers: dict[str, dict[int, list[int]]] = defaultdict(dict)
        self.bins: dict[tuple[str, int], int] = defaultdict(int)
        #: receiver -> counter (and ``facts``, ``min_pickup_us``, ``min_relay_us``) -> value
        self.per_receiver: dict[str, dict[str, int]] = defaultdict(dict)
        table = _named(table, destinations)
        latencies = table.filter(pc.greater(table.column("n"), 0))
        for level, keys in LEVELS:
            for names, arrays in _level_groups(latencies, keys).items():
                metric, destination, recipient = (*names, None, None)[:3]
                self.groups[(level, destination, recipient)][METRICS[metric]] = arrays
        drawn = pc.is_in(
            latencies.column("metric"), pa.array([CODES[m] for m in HISTOGRAM_METRICS], pa.int8())
        )
        per_bin = latencies.filter(drawn).group_by(["metric", "bin"]).aggregate([("n", "sum")])
        for row in per_bin.to_pylist():
            self.bins[(METRICS[row["metric"]], row["bin"])] += row["n_sum"]
        relay = table.filter(pc.equal(table.column("metric"), CODES["relay"]))
        by_receiver = relay.group_by(["key3", "bucket"]).aggregate(
            [
                ("rows", "sum"),
                ("n", "sum"),
                ("lo", "min"),
                ("hi", "max"),
                ("lo2", "min"),
                *((name, "sum") for name in COUNTERS),
            ]
        )
        for row in by_receiver.to_pylist():
            n, lo, hi, bucket = row["n_sum"], row["lo_min"], row["hi_max"], row["bucket"]
            counts = self.per_receiver[row["key3"]]
            for name in COUNTERS:
                counts[name] = counts.get(name, 0) + int(row[f"{name}_sum"] or 0)
            counts["other_rows"] = counts.get("other_rows", 0) + row["rows_sum"] - n
            if not n:
                continue
            _merge(self.receivers[row["key3"]], bucket, n, lo, hi)
            counts["facts"] = counts.get("facts", 0) + n
            for name, value in (("min_pickup_us", row["lo2_min"]), ("min_relay_us", lo)):
                counts[name] = value if name not in counts else min(counts[name], value)

    def latency_rows(self) -> list[dict[str, Any]]:
        """The ``latency`` table: per level, counts and p50/p90/p99 of every metric."""
        rows = []
        for (level, destination, recipient), metrics in self.groups.items():
            row: dict[str, Any] = {
                "destination": destination,
                "recipient": recipient,
                "level": level,
                "acks": _total(metrics.get("pickup")),
                "commit_acks": _total(metrics.get("process")),
            }
            for metric in METRICS:
                for p in PERCENTILES:
                    row[f"{metric}_p{round(p * 100)}_ms"] = _percentile_of(metrics.get(metric), p)
            rows.append(row)
        return sorted(
            rows, key=lambda r: (r["level"], _key(r["destination"]), _key(r["recipient"]))
        )

    def histogram_rows(self) -> list[dict[str, Any]]:
        """The ``latency_histogram`` table: pickup and process counts per bin."""
        return [
            {"metric": metric, "bin": bin_, "count": count}
            for (metric, bin_), count in sorted(self.bins.items())
        ]

    def totals(self) -> dict[str, int]:
        """Every counter (and ``facts``) summed over the receivers."""
        found: dict[str, int] = dict.fromkeys((*COUNTERS, "other_rows", "facts"), 0)
        for counts in self.per_receiver.values():
            for name in found:
                found[name] += counts.get(name, 0)
        return found

    def receiver_metrics(self) -> list[dict[str, Any]]:
        """Per receiver with well-formed acks of known CMs: ``receiver, facts,
        min_pickup_us, min_relay_us`` (see :mod:`spark_audit.transforms.skew`)."""
        return [
            {"receiver": receiver, **counts}
            for receiver, counts in self.per_receiver.items()
            if counts.get("facts")
        ]

    def relay_by_receiver(self) -> dict[str, dict[str, float | None]]:
        """Per receiver: ``relay_p50_ms``, ``relay_p90_ms``, ``relay_p99_ms``."""
        return {
            receiver: {
                f"relay_p{round(p * 100)}_ms": percentile(_buckets(merged), p) for p in PERCENTILES
            }
            for receiver, merged in self.receivers.items()
        }


def _named(table: pa.Table, destinations: Sequence[str]) -> pa.Table:
    """``table`` with ``key1`` the destination's name where ``code1`` stood for it."""
    codes = table.column("code1")
    if codes.null_count == len(codes):
        return table.drop_columns(["code1"])
    names = pc.take(pa.array(destinations, pa.string()), codes)
    key1 = pc.if_else(pc.is_valid(codes), names, table.column("key1"))
    index = table.schema.get_field_index("key1")
    return table.set_column(index, "key1", key1).drop_columns(["code1"])


def _total(arrays: Arrays | None) -> int:
    return int(arrays[0].sum()) if arrays is not None else 0


def _key(value: Any) -> tuple[bool, str]:
    """Sort nulls first, like Spark's ascending order."""
    return (value is not None, "" if value is None else str(value))
