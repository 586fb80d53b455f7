"""Benchmark: the full Spark audit against a plain scan + groupBy of the same Parquet.

For each size (acks), generates a synthetic store with ``spark_audit.generate`` (Spark
itself, not Python loops), then times in the same session:

* the baseline (:func:`baseline`, best of three runs): a plain Spark scan of every table and
  column the audit reads, with one groupBy and no join and no cache. ``cms`` (``cm_id,
  sender, sent_at, condition_json, evaluation_deadline, state, decided_at, effective_at,
  reasons_json``), ``compensations`` (``cm_id, destination, released_at``) and every
  column of ``anomalies`` are each read into Spark's ``noop`` sink (every value is
  decoded, nothing is kept); every column of ``acks`` is read and grouped by
  ``(cm_id, destination)`` with ``count(*)`` and ``count(column)`` of each other column,
  into ``noop`` too. ``copies`` is not read (the audit does not read it);
* the full audit (``run_audit`` over ``read_parquet``: the cut, every table, the
  re-evaluation of every decided CM, the checks, ``summary.json`` and ``report.html``),
  also best of three runs;
* the floor (:func:`floor`, best of three runs): the least Spark work that any audit
  re-evaluating each CM from its acks must do, to show how much of the audit's time is
  that work and how much is the audit's own design. Reported next to both.

All three are timed the same way: one untimed run first (in a fresh JVM it pays for
class loading, Janino compiling the generated classes and HotSpot compiling them; the
audit's is reported as ``audit_cold_s``), then the best of three. Every run's time is in
the JSON line. ``--cold`` times the audit's first run alone instead (the baseline is
then still warm: its untimed run comes first).

Prints four lines per size: the audit and the baseline with their ratio against its
target (audit / baseline <= 4); the floor, and the audit against it (target <= 3 at 10M
acks); one what-if (``pickup*=2``) and a 10-point pickup sweep, each timed like the audit
and as a ratio to the audit of the same data (targets <= 1.5 and <= 4). Then the warm audit
of 20,000 acks against its 3 s budget (:func:`fixed_cost`), then the largest size's audit /
the smallest's (target <= 12 for 10x the acks), and ends with ONE JSON line holding every figure.

    .venv/bin/python -m bench.audit_scale                      # 1M and 10M acks
    .venv/bin/python -m bench.audit_scale --sizes 100000       # a quick run
    .venv/bin/python -m bench.audit_scale --what-if-only       # audit, what-if, sweep only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench._common import Row, emit_result, log
from condmsg.archive.layout import ACKS, ANOMALIES
from spark_audit.generate import Injected, generate
from spark_audit.generate_spec import GenerateSpec
from spark_audit.job import AuditOptions, run_audit
from spark_audit.readers import Window, read_parquet
from spark_audit.session import SessionOptions, build_session
from spark_audit.settings import audit_settings, least_partitions, partitions_for
from spark_audit.templates import default_templates

#: The targets: the audit within 3x the floor at 10M acks and 4x the plain
#: scan + groupBy, and a warm audit of 20,000 acks within 3 s.
TARGET_AUDIT_VS_FLOOR = 3.0
TARGET_AUDIT_VS_SCAN = 4.0
TARGET_10X_SCALING = 12.0
FIXED_COST_ACKS = 20_000
TARGET_FIXED_COST_S = 3.0
#: What-if replay (docs/audit.md): one what-if within 1.5x the audit of the same data, a
#: 10-point sweep within 4x.
TARGET_WHAT_IF_VS_AUDIT = 1.5
TARGET_SWEEP_VS_AUDIT = 4.0
SWEEP_GRID = ("500ms", "1s", "2s", "3s", "4s", "5s", "7s", "10s", "15s", "30s")


def acks_per_cm() -> float:
    """Expected acks per CM for the default template mix (before late drops)."""
    templates = default_templates()
    total = sum(t.weight for t in templates)
    return sum(t.weight / total * len(t.slots()) * t.p_ack for t in templates)


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


#: The columns the audit reads, per input table (``copies`` it does not read).
AUDIT_READS = {
    "cms": (
        "cm_id",
        "sender",
        "sent_at",
        "condition_json",
        "evaluation_deadline",
        "state",
        "decided_at",
        "effective_at",
        "reasons_json",
    ),
    "compensations": ("cm_id", "destination", "released_at"),
    "anomalies": ANOMALIES.column_names,
    "acks": ACKS.column_names,
}


def _run(frame: DataFrame) -> None:
    """Compute ``frame`` completely and discard it (Spark's ``noop`` sink)."""
    frame.write.format("noop").mode("overwrite").save()


def baseline(spark: SparkSession, directory: Path) -> None:
    """A plain scan of every table and column the audit reads, with one groupBy.

    The same reader as the audit (``read_parquet``: explicit schemas). ``cms``,
    ``compensations`` and ``anomalies``: each scanned once, the audit's columns only
    (written to Spark's ``noop`` sink, so every value is read and nothing is kept).
    ``acks``: every column, grouped by ``(cm_id, destination)`` (the natural key of a
    consumption) with ``count(*)`` and ``count(column)`` of each other column (so every
    column is read), again into ``noop``. No join, no cache.
    """
    data = read_parquet(spark, directory)
    for name in ("cms", "compensations", "anomalies"):
        _run(getattr(data, name).select(*AUDIT_READS[name]))
    keys = ("cm_id", "destination")
    others = [c for c in AUDIT_READS["acks"] if c not in keys]
    _run(data.acks.groupBy(*keys).agg(F.count(F.lit(1)), *(F.count(c) for c in others)))


def floor(spark: SparkSession, directory: Path, partitions: int) -> None:
    """The least work of any audit that judges each CM from its acks, as two queries.

    Both read the CMs (a 64-bit hash of ``cm_id``, ``sent_at`` and a hash of the
    condition) and the acks (the hash of ``cm_id``, destination, recipient, kind, the
    read and commit instants, status) with the audit's reader, shuffle both by the hash
    and join them (every CM with its acks; the CMs on the build side, as in the audit's
    join). The first query groups the join by CM (a verdict's inputs: counts, first
    instants, counted acks); the second groups it into a pickup-latency histogram per
    destination and recipient. Two queries, as a Spark plan is a tree: the join is
    computed once for each consumer, with no cache. No window, no plans, no detail
    tables. It runs under the audit's settings
    (:func:`spark_audit.settings.audit_settings`: adaptive execution off, the shuffles on
    ``partitions``, the audit's number for the store, see ``measure``).
    """
    data = read_parquet(spark, directory)
    key = F.xxhash64("cm_id").alias("key")
    cms = data.cms.select(
        key, F.unix_micros("sent_at").alias("sent"), F.xxhash64("condition_json").alias("plan")
    ).repartition(partitions, "key")
    acks = data.acks.select(
        key,
        "destination",
        "recipient",
        "kind",
        F.unix_micros("read_at").alias("read"),
        F.unix_micros("committed_at").alias("commit"),
        "status",
    ).repartition(partitions, "key")
    joined = cms.hint("shuffle_hash").join(acks, "key", "left")
    per_cm = joined.groupBy("key").agg(
        F.count("read"),
        F.min("read"),
        F.min("commit"),
        F.max("sent"),
        F.max("plan"),
        F.count(F.when(F.col("status") == "counted", 1)),
    )
    pickup = F.greatest(F.col("read") - F.col("sent"), F.lit(1))
    histogram = joined.groupBy(
        "destination", "recipient", F.floor(F.log2(pickup)).alias("bin")
    ).count()
    with audit_settings(spark, partitions):
        _run(per_cm)
        _run(histogram)


def spec_for(target_acks: int) -> GenerateSpec:
    cms = max(1000, round(target_acks / acks_per_cm()))
    k = max(1, cms // 100_000)
    return GenerateSpec(
        cms=cms,
        interval_ms=20,
        wrong_verdicts=10 * k,
        late_harmless=5 * k,
        late_changing=5 * k,
        duplicates=10 * k,
        orphans=10 * k,
        multiple_consumptions=10 * k,
        stale_pending=5 * k,
        skewed_receivers={"rcv-qb": -3000, "rcv-w2": 2000},
    )


def expected_faults(spec: GenerateSpec) -> dict[str, int]:
    """Every injected fault's metric and its exact expected value (and nothing else)."""
    return {
        "discrepancies": spec.wrong_verdicts,
        "late_acks": spec.late_harmless + spec.late_changing,
        "late_acks_changing_verdict": spec.late_changing,
        "late_ack_flag_mismatches": 0,
        "orphan_acks": spec.orphans,
        "duplicate_acks": spec.duplicates,
        "multiple_consumptions": spec.multiple_consumptions,
        "stale_pending": spec.stale_pending,
        "counted_after_decision": 0,
        "not_counted_before_decision": 0,
        "not_counted_while_pending": 0,
        "malformed_acks": 0,
        "invalid_conditions": 0,
    }


def prepare(
    spark: SparkSession, target: int, root: Path, say: Callable[[str], None], *, reuse: bool
) -> tuple[GenerateSpec, Injected, float, Callable[[], Any]]:
    """The store of ``target`` acks (generated, or an earlier run's with ``reuse``), the
    seconds generating it took, and the audit of it as an action to time."""
    data_dir, out_dir = root / f"data-{target}", root / f"out-{target}"
    shutil.rmtree(out_dir, ignore_errors=True)
    spec = spec_for(target)
    marker = data_dir / "injected.json"
    if reuse and marker.exists() and json.loads(marker.read_text())["cms"] == spec.cms:
        gen_s, injected = 0.0, Injected(**json.loads(marker.read_text()))
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
        gen_s, injected = timed(lambda: generate(spark, spec, data_dir))
    say(f"{target:>10} acks target: generated {injected.acks} acks, {spec.cms} CMs in {gen_s:.1f}s")

    def audit() -> Any:
        window = Window(until=spec.until)
        data = read_parquet(spark, data_dir)
        options = AuditOptions(out=out_dir, window=window, source=str(data_dir))
        return run_audit(spark, data, options, progress=lambda _m: None)

    return spec, injected, gen_s, audit


def measure(
    spark: SparkSession,
    target: int,
    root: Path,
    say: Callable[[str], None],
    *,
    reuse: bool,
    warm: bool,
) -> dict[str, Any]:
    spec, injected, gen_s, audit = prepare(spark, target, root, say, reuse=reuse)
    data_dir = root / f"data-{target}"
    cold_s = None
    if warm:
        cold_s, _ = timed(audit)
    baseline(spark, data_dir)
    scans = [timed(lambda: baseline(spark, data_dir))[0] for _ in range(3)]
    scan_s = min(scans)
    partitions = partitions_for(spark, spec.cms, least_partitions(spark))
    floor(spark, data_dir, partitions)
    floors = [timed(lambda: floor(spark, data_dir, partitions))[0] for _ in range(3)]
    floor_s = min(floors)
    audits = [timed(audit) for _ in range(3 if warm else 1)]
    audit_s, result = min(audits, key=lambda run: run[0])
    exact = all(
        run.summary["metrics"][metric] == expected
        for _, run in audits
        for metric, expected in expected_faults(spec).items()
    )
    say(
        f"{'':>10} scan+groupBy {scan_s:.2f}s  full audit {audit_s:.2f}s  "
        f"ratio {audit_s / scan_s:.2f} (target <= {TARGET_AUDIT_VS_SCAN})  "
        f"injected faults found exactly: {exact}"
        + (f"  (first audit, untimed: {cold_s:.2f}s)" if cold_s is not None else "")
    )
    say(
        f"{'':>10} floor {floor_s:.2f}s: {floor_s / scan_s:.2f} x scan+groupBy; "
        f"the audit is {audit_s / floor_s:.2f} x the floor (target <= {TARGET_AUDIT_VS_FLOOR})"
    )
    replay = what_if_figures(spark, data_dir, spec, audit_s, say)
    return {
        "target_acks": target,
        "acks": injected.acks,
        "cms": spec.cms,
        "generate_s": round(gen_s, 3),
        "scan_groupby_s": round(scan_s, 3),
        "scan_groupby_runs_s": [round(s, 3) for s in scans],
        "floor_s": round(floor_s, 3),
        "floor_runs_s": [round(s, 3) for s in floors],
        "floor_vs_scan": round(floor_s / scan_s, 3),
        "audit_vs_floor": round(audit_s / floor_s, 3),
        "audit_vs_floor_target": TARGET_AUDIT_VS_FLOOR,
        "audit_vs_floor_ok": audit_s / floor_s <= TARGET_AUDIT_VS_FLOOR,
        "audit_s": round(audit_s, 3),
        "audit_runs_s": [round(s, 3) for s, _ in audits],
        "audit_warm": warm,
        "audit_cold_s": round(cold_s, 3) if cold_s is not None else None,
        "audit_vs_scan": round(audit_s / scan_s, 3),
        "audit_vs_scan_target": TARGET_AUDIT_VS_SCAN,
        "audit_vs_scan_ok": audit_s / scan_s <= TARGET_AUDIT_VS_SCAN,
        "audit_steps_s": result.timings,
        "faults_found_exactly": exact,
        "status": result.status,
        **replay,
    }


def measure_what_if(
    spark: SparkSession, target: int, root: Path, say: Callable[[str], None], *, reuse: bool
) -> dict[str, Any]:
    """The audit (one untimed run, the best of three), the what-if and the sweep alone:
    no baseline, no floor."""
    spec, injected, gen_s, audit = prepare(spark, target, root, say, reuse=reuse)
    load_before = os.getloadavg()[0]
    cold_s, _ = timed(audit)
    audits = [timed(audit)[0] for _ in range(3)]
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    say(f"{'':>10} full audit {min(audits):.2f}s (load average {load[0]:.1f} -> {load[1]:.1f})")
    return {
        "target_acks": target,
        "acks": injected.acks,
        "cms": spec.cms,
        "generate_s": round(gen_s, 3),
        "audit_s": round(min(audits), 3),
        "audit_runs_s": [round(s, 3) for s in audits],
        "audit_cold_s": round(cold_s, 3),
        "audit_load_avg": load,
        **what_if_figures(spark, root / f"data-{target}", spec, min(audits), say),
    }


def what_if_figures(
    spark: SparkSession, data_dir: Path, spec: GenerateSpec, audit_s: float, say: Any
) -> dict[str, Any]:
    """One what-if (``pickup*=2``) and a 10-point pickup sweep, each timed like the audit
    (one untimed run, the best of three) and as a ratio to it."""
    from spark_audit.what_if import sweep, what_if

    def one() -> Any:
        data = read_parquet(spark, data_dir)
        run = what_if(spark, data, ["pickup*=2"], until=spec.until, explain=0)
        run.cms.unpersist()  # else every timed run would keep its CMs in memory
        return run.totals

    def grid() -> Any:
        data = read_parquet(spark, data_dir)
        return sweep(spark, data, "pickup", list(SWEEP_GRID), until=spec.until).points

    figures: dict[str, Any] = {
        "what_if_changes": ["pickup*=2"],
        "sweep10_parameter": "pickup",
        "sweep10_grid": list(SWEEP_GRID),
        "what_if_baseline": "audit_s",
        "what_if_baseline_s": round(audit_s, 3),
    }
    for name, action, target in (
        ("what_if", one, TARGET_WHAT_IF_VS_AUDIT),
        ("sweep10", grid, TARGET_SWEEP_VS_AUDIT),
    ):
        load_before = os.getloadavg()[0]
        cold = timed(action)[0]
        runs = [timed(action)[0] for _ in range(3)]
        best = min(runs)
        ratio = best / audit_s
        load = (load_before, os.getloadavg()[0])
        say(
            f"{'':>10} {name} {best:.2f}s vs audit {audit_s:.2f}s: "
            f"ratio {ratio:.2f} (target <= {target}; load average {load[0]:.1f} -> {load[1]:.1f})"
        )
        figures.update(
            {
                f"{name}_s": round(best, 3),
                f"{name}_runs_s": [round(r, 3) for r in runs],
                f"{name}_cold_s": round(cold, 3),
                f"{name}_vs_audit": round(ratio, 3),
                f"{name}_vs_audit_target": target,
                f"{name}_vs_audit_ok": ratio <= target,
                f"{name}_load_avg": [round(x, 2) for x in load],
            }
        )
    return figures


def fixed_cost(
    spark: SparkSession, root: Path, say: Callable[[str], None], *, reuse: bool
) -> dict[str, Any]:
    """The audit's fixed cost: a warm audit of :data:`FIXED_COST_ACKS` acks (one untimed
    run, then the best of five), where the time is nearly all per-job and per-table
    overhead rather than work on the rows."""
    data_dir, out_dir = root / f"data-{FIXED_COST_ACKS}", root / f"out-{FIXED_COST_ACKS}"
    spec = spec_for(FIXED_COST_ACKS)
    marker = data_dir / "injected.json"
    if not (reuse and marker.exists() and json.loads(marker.read_text())["cms"] == spec.cms):
        shutil.rmtree(data_dir, ignore_errors=True)
        generate(spark, spec, data_dir)

    def audit() -> Any:
        window = Window(until=spec.until)
        options = AuditOptions(out=out_dir, window=window, source=str(data_dir))
        return run_audit(spark, read_parquet(spark, data_dir), options, progress=lambda _m: None)

    audit()
    runs = [timed(audit)[0] for _ in range(5)]
    best = min(runs)
    say(
        f"{FIXED_COST_ACKS:>10} acks: warm audit {best:.2f}s "
        f"(target <= {TARGET_FIXED_COST_S}s; runs {', '.join(f'{r:.2f}' for r in runs)})"
    )
    return {
        "acks": FIXED_COST_ACKS,
        "audit_s": round(best, 3),
        "audit_runs_s": [round(r, 3) for r in runs],
        "target_s": TARGET_FIXED_COST_S,
        "ok": best <= TARGET_FIXED_COST_S,
    }


def _at_most(figure: str, value: float, baseline: float | None, target: float) -> Row:
    """A table row whose target is its ratio to ``baseline`` at most ``target`` (with no
    baseline, the value itself, in seconds)."""
    ratio = value / baseline if baseline else None
    held = ratio if baseline else value
    return Row(
        figure,
        round(value, 3),
        "s",
        None if baseline is None else round(baseline, 3),
        None if ratio is None else round(ratio, 3),
        f"ratio <= {target:g}" if baseline else f"<= {target:g} s",
        held is not None and held <= target,
    )


def table(figures: dict[str, Any]) -> list[Row]:
    """``make bench``'s rows: per size the audit against the scan and the floor, the
    what-if and the sweep against the audit; the fixed cost; the scaling."""
    rows = []
    for run in figures["runs"]:
        size = f"{run['acks']:,} acks"
        if "scan_groupby_s" in run:
            rows.append(
                _at_most(
                    f"audit, {size}", run["audit_s"], run["scan_groupby_s"], TARGET_AUDIT_VS_SCAN
                )
            )
            rows.append(
                _at_most(
                    f"audit vs floor, {size}", run["audit_s"], run["floor_s"], TARGET_AUDIT_VS_FLOOR
                )
            )
        for name, label in (("what_if", "one what-if"), ("sweep10", "10-point sweep")):
            target = run[f"{name}_vs_audit_target"]
            rows.append(_at_most(f"{label}, {size}", run[f"{name}_s"], run["audit_s"], target))
    if figures.get("fixed_cost"):
        fixed = figures["fixed_cost"]
        rows.append(_at_most("warm audit, 20,000 acks", fixed["audit_s"], None, fixed["target_s"]))
    if "scaling" in figures:
        scaling = figures["scaling"]
        rows.append(
            Row(
                "audit time, 10x the acks",
                scaling["audit_time_ratio"],
                "x",
                target=f"<= {scaling['target']:g}",
                ok=scaling["ok"],
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="acks per run, comma-separated")
    parser.add_argument("--dir", default="/tmp/condmsg-audit-bench", help="scratch directory")
    parser.add_argument("--master", help="Spark master (default: the environment's)")
    parser.add_argument("--driver-memory", default="12g", help="spark.driver.memory")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=8,
        help="the session's spark.sql.shuffle.partitions (the baseline's groupBy; the audit "
        "sets its own, see spark_audit.settings.partitions_for)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="reuse generated data from an earlier run"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="time the first audit of each size alone (default: like the baseline, one "
        "untimed run, then the best of three)",
    )
    parser.add_argument(
        "--what-if-only",
        action="store_true",
        help="time the audit, the what-if and the sweep only (no baseline, floor or fixed cost)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    say = log
    spark = build_session(
        SessionOptions(
            app_name="condmsg-audit-bench",
            master=args.master,
            driver_memory=args.driver_memory,
            quiet=True,
        )
    )
    # On the running session, not at launch: the audit keeps a launch setting as the
    # user's, and replaces this one with its own for its run.
    spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    root = Path(args.dir)
    if args.what_if_only:
        runs = [measure_what_if(spark, size, root, say, reuse=args.reuse) for size in sizes]
    else:
        runs = [
            measure(spark, size, root, say, reuse=args.reuse, warm=not args.cold) for size in sizes
        ]
    figures: dict[str, Any] = {
        "spark": spark.version,
        "master": spark.sparkContext.master,
        "runs": runs,
        # A size of this run already generated the fixed cost's data where they coincide.
        "fixed_cost": None
        if args.what_if_only
        else fixed_cost(spark, root, say, reuse=args.reuse or FIXED_COST_ACKS in sizes),
        "targets": {
            "audit_vs_floor": TARGET_AUDIT_VS_FLOOR,
            "audit_vs_scan": TARGET_AUDIT_VS_SCAN,
            "scaling_10x": TARGET_10X_SCALING,
            "warm_20k_audit_s": TARGET_FIXED_COST_S,
            "what_if_vs_audit": TARGET_WHAT_IF_VS_AUDIT,
            "sweep10_vs_audit": TARGET_SWEEP_VS_AUDIT,
        },
    }
    if len(runs) >= 2:
        small, large = runs[0], runs[-1]
        scaling = large["audit_s"] / small["audit_s"]
        figures["scaling"] = {
            "acks_ratio": round(large["acks"] / small["acks"], 3),
            "audit_time_ratio": round(scaling, 3),
            "target": TARGET_10X_SCALING,
            "ok": scaling <= TARGET_10X_SCALING,
        }
        say(
            f"audit time {large['target_acks']}/{small['target_acks']}: {scaling:.2f} "
            f"(target <= {TARGET_10X_SCALING})"
        )
    emit_result("audit_scale", figures, table(figures))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
