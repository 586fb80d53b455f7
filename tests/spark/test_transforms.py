"""The whole audit on one small handmade store whose answers are worked out by hand.

The store (T0 = 2024-01-01 UTC; times in ms after T0):

* c1 (s1) ``qa`` pickup 1 s: read at 200 by rA -> satisfied (correct).
* c2 (s1) ``qb`` process 1 s: a READ ack at 100 by rC (received at 90: rC is ahead) ->
  truly violated, stored satisfied: the one discrepancy.
* c3 (s2) set{qa,qb} pickup 2 s, min 1: no counted ack -> violated (correct); a read of qa
  at 500 received at 2600, after the decision at 2500, would have made it satisfied
  (flagged ``changes_verdict``); compensations released to qa and qb.
* c4 (s2) ``qc`` pickup 1 s, still pending 10 min later (stale); two acks for its one queue
  copy, read at -2000 and -1990 by rB (behind by at least 2 s).
* c5 (s2, sent at 1 h) ``qa`` pickup 1 s: read late at +2000 by rC, yet labelled counted
  although received (+1400) after the decision (+1300) -> violated (correct).
* orphans: ack a5 for CM "ghost" (also an ``unknown_cm`` anomaly) and anomaly-only a6;
  one ``duplicate`` anomaly; a7 is a malformed COMMIT ack without ``committed_at``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from condmsg.core.conditions import Destination, DestinationSet
from spark_audit.alongside import run_alongside
from spark_audit.job import AuditOptions, run_audit
from spark_audit.readers import AuditInput, Window, apply_window
from spark_audit.transforms.ack_flags import FLAG_COLUMNS, pack_flags, unpack_flags
from spark_audit.transforms.anomalies import COUNTERS
from spark_audit.transforms.conditions import plan_set
from spark_audit.transforms.latency import CODES, Histograms, percentile
from tests.spark.builders import T0, ack_row, at, cm_row, frame
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

s = timedelta(seconds=1)
HOUR = 3_600_000
UNTIL = at(10 * 60_000 + HOUR)


def _store(spark: Any) -> AuditInput:
    qa, qb, qc = Destination("qa"), Destination("qb"), Destination("qc")
    cms = [
        cm_row(
            "c1",
            Destination("qa", pickup_within=s),
            sender="s1",
            state="satisfied",
            decided_at=at(500),
            effective_at=at(250),
        ),
        cm_row(
            "c2",
            Destination("qb", process_within=s),
            sender="s1",
            state="satisfied",
            decided_at=at(400),
            effective_at=at(150),
        ),
        cm_row(
            "c3",
            DestinationSet(qa, qb, pickup_within=2 * s, min_pickup=1),
            sender="s2",
            state="violated",
            decided_at=at(2500),
            effective_at=at(2250),
        ),
        cm_row("c4", Destination("qc", pickup_within=s), sender="s2"),
        cm_row(
            "c5",
            Destination("qa", pickup_within=s),
            sender="s2",
            sent_at=at(HOUR),
            state="violated",
            decided_at=at(HOUR + 1300),
            effective_at=at(HOUR + 1050),
        ),
    ]
    del qc
    acks = [
        ack_row("a1", "c1", "qa", read_at=at(200), received_at=at(250), receiver="rA"),
        ack_row("a2", "c2", "qb", read_at=at(100), received_at=at(90), receiver="rC"),
        ack_row(
            "a3",
            "c3",
            "qa",
            read_at=at(500),
            received_at=at(2600),
            receiver="rA",
            status="changes_verdict",
        ),
        ack_row("a4", "c4", "qc", read_at=at(-2000), received_at=at(10), receiver="rB"),
        ack_row("a4b", "c4", "qc", read_at=at(-1990), received_at=at(20), receiver="rB"),
        ack_row("a5", "ghost", "qa", read_at=at(10), received_at=at(20), receiver="rA"),
        {
            **ack_row("a7", "c1", "qa", read_at=at(300), received_at=at(30), receiver="rA"),
            "kind": "commit",
        },
        ack_row(
            "a8",
            "c5",
            "qa",
            read_at=at(HOUR + 2000),
            received_at=at(HOUR + 1400),
            receiver="rC",
        ),
    ]
    compensations = [
        {"cm_id": "c3", "destination": d, "system_generated": True, "released_at": at(2510)}
        for d in ("qa", "qb")
    ]
    anomaly_rows = [
        {"id": 1, "kind": "duplicate", "cm_id": "c1", "ack_id": "a1", "detail": "dup"},
        {"id": 2, "kind": "unknown_cm", "cm_id": "ghost", "ack_id": "a5", "detail": "?"},
        {"id": 3, "kind": "unknown_cm", "cm_id": "ghost2", "ack_id": "a6", "detail": "?"},
    ]
    for row in anomaly_rows:
        row["recorded_at"] = at(30)
    return AuditInput(
        cms=frame(spark, "cms", cms),
        copies=frame(spark, "copies", []),
        acks=frame(spark, "acks", acks),
        compensations=frame(spark, "compensations", compensations),
        anomalies=frame(spark, "anomalies", anomaly_rows),
        spheres=frame(spark, "spheres", []),
    )


def _audit(spark: Any, out: Path) -> dict[str, Any]:
    """The whole audit of the handmade store (uncut: the audit cuts it at ``UNTIL``)."""
    options = AuditOptions(
        out=out, window=Window(until=UNTIL), source="handmade", bucket_seconds=3600
    )
    result = run_audit(spark, _store(spark), options, progress=lambda _m: None)
    tables = {path.name: pq.read_table(path).to_pylist() for path in (out / "tables").iterdir()}
    return {"summary": result.summary, "tables": tables}


@pytest.fixture(scope="session")
def audited(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _audit(spark, tmp_path_factory.mktemp("handmade"))


@pytest.mark.parametrize(
    "broken",
    [
        # The per-CM job, in its second driver thread.
        "spark_audit.job.rates.rollup_frame",
        # The histogram's side, while the per-CM job runs beside it (it is cancelled).
        "spark_audit.job.Histograms",
        # The detail step: the stored reasons in their second thread, and the main side
        # while they are read.
        "spark_audit.details._stored_reasons",
        "spark_audit.details._late_effects",
    ],
)
def test_a_failure_on_either_side_of_the_two_threads_reaches_the_caller(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """The per-CM job runs in a second driver thread beside the histogram's; an error on
    either side is raised by ``run_audit`` itself, and the audit writes no summary."""

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"{broken} failed")

    monkeypatch.setattr(broken, fail)
    with pytest.raises(RuntimeError, match=f"{broken} failed"):
        _audit(spark, tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_a_job_submitted_beside_a_failed_block_is_cancelled_not_waited_for(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second thread submits its job only after the block has failed and its tag was
    cancelled once (as when the histogram fails while the per-CM job is still being
    planned): that job is cancelled too (it would scan 10^12 rows, many minutes on two
    cores) and the block's error is raised."""
    context = spark.sparkContext
    cancel = context.cancelJobsWithTag
    cancelled = threading.Event()

    def cancel_and_tell(tag: str) -> None:
        cancel(tag)
        cancelled.set()

    monkeypatch.setattr(context, "cancelJobsWithTag", cancel_and_tell)

    def work() -> Any:
        cancelled.wait(timeout=60)
        return spark.range(0, 10**12, numPartitions=2).selectExpr("sum(id * 7 % 13)").collect()

    def block() -> None:
        with run_alongside(spark, work):
            raise RuntimeError("the block failed")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="the block failed"):
        block()
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        # Too many flagged CMs to collect their acks: cached, and the CMs that
        # ``evaluate`` explains are judged on the executors.
        ("spark_audit.details.DRIVER_EXPLAIN", 0),
        # Too many listed acks: neither collected nor cached, and every detail table
        # written by Spark.
        ("spark_audit.output.DRIVER_ROWS", 0),
    ],
)
def test_the_detail_tables_are_the_same_whichever_way_the_candidate_acks_are_held(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    audited: dict[str, Any],
    setting: str,
    value: int,
) -> None:
    """The candidate acks are collected to the driver when they are few (the default
    here); past either bound they stay in Spark, and every table is the same."""
    monkeypatch.setattr(setting, value)
    again = _audit(spark, tmp_path)
    assert again["summary"]["metrics"] == audited["summary"]["metrics"]
    for name, rows in audited["tables"].items():
        assert _sorted(again["tables"][name]) == _sorted(rows), name


def _sorted(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


def _by(rows: list[dict[str, Any]], *keys: str) -> dict[Any, dict[str, Any]]:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def test_plans_give_shapes_and_native_flags(spark: Any) -> None:
    cms = _store(spark).cms
    plans = plan_set(cms)
    rows = plans.attach(cms).join(plans.frame.drop("condition_json"), "plan_id").collect()
    got = {r["cm_id"]: r.asDict() for r in rows}
    assert got["c1"]["shape"] == "queue(pickup)"
    assert got["c3"]["shape"] == "set(pickup,min_pickup=1)[queue,queue]"
    assert got["c3"]["skeleton"] == "set(pickup,min_pickup)[queue(),queue()]"
    assert all(r["native"] and r["valid"] for r in got.values())


def test_reevaluation_finds_the_one_wrong_verdict(audited: dict[str, Any]) -> None:
    rows = audited["tables"]["discrepancies"]
    assert [(r["cm_id"], r["stored_verdict"], r["recomputed_verdict"]) for r in rows] == [
        ("c2", "satisfied", "violated")
    ]
    evidence = rows[0]
    assert evidence["python_verdict"] == "violated"
    assert evidence["path"] == "native"
    assert evidence["counted_acks"] == 1
    assert any("READ ack" in reason for reason in evidence["reasons"])
    assert evidence["stored_reasons_json"] == "[]"


def test_late_ack_that_would_change_the_verdict(audited: dict[str, Any]) -> None:
    assert audited["tables"]["late_ack_effects"] == [
        {
            "cm_id": "c3",
            "late_acks": 1,
            "stored_verdict": "violated",
            "verdict_counted": "violated",
            "verdict_with_late": "satisfied",
            "changes_verdict": True,
            "flagged": True,
        }
    ]
    metrics = audited["summary"]["metrics"]
    assert (metrics["late_acks_changing_verdict"], metrics["late_ack_flag_mismatches"]) == (1, 0)


def test_latency_percentiles_per_destination_recipient_and_overall(
    audited: dict[str, Any],
) -> None:
    rows = audited["tables"]["latency"]
    overall = next(r for r in rows if r["level"] == "all")
    assert overall["acks"] == 6  # a7 is malformed, a5 is an orphan
    qa = next(r for r in rows if r["level"] == "recipient" and r["destination"] == "qa")
    assert qa["acks"] == 3
    assert (qa["pickup_p50_ms"], qa["pickup_p99_ms"]) == (500.0, 2000.0)
    assert qa["process_p50_ms"] is None


def test_latency_histogram_bins(audited: dict[str, Any]) -> None:
    rows = {(r["metric"], r["bin"]): r["count"] for r in audited["tables"]["latency_histogram"]}
    # pickups: 200, 100, 500, -2000, -1990, 2000 ms
    assert rows == {
        ("pickup", -1): 2,
        ("pickup", 7): 1,  # [64, 128)
        ("pickup", 8): 1,  # [128, 256)
        ("pickup", 9): 1,  # [256, 512)
        ("pickup", 11): 1,  # [1024, 2048)
    }


def test_percentiles_interpolate_within_a_bucket() -> None:
    # Two values in one bucket: rank 1 is the smallest, rank 2 the largest, exactly.
    assert percentile([(2, 1000, 1010)], 0.5) == 1.0
    assert percentile([(2, 1000, 1010)], 0.99) == 1.01
    # Four values, ranks 2 and 4 fall in the second bucket (three values, 100..103 µs).
    assert percentile([(1, 5, 5), (3, 100, 103)], 0.5) == 0.1
    assert percentile([(1, 5, 5), (3, 100, 103)], 0.9) == 0.103
    assert percentile([], 0.5) is None


def test_packed_flags_round_trip_with_nulls(spark: Any) -> None:
    # Each flag column true, false and null in turn (the others varying too): packing
    # them into one int and unpacking gives every value back, nulls included.
    values = (True, False, None)
    rows = [
        {"id": i, **{name: values[(i + k) % 3] for k, name in enumerate(FLAG_COLUMNS)}}
        for i in range(9)
    ]
    schema = "id int, " + ", ".join(f"{name} boolean" for name in FLAG_COLUMNS)
    original = spark.createDataFrame([tuple(r.values()) for r in rows], schema)
    packed = pack_flags(original)
    assert packed.columns == ["id", "flags"]
    back = unpack_flags(packed)
    assert back.columns == original.columns
    assert sorted((r.asDict() for r in back.collect()), key=lambda r: r["id"]) == rows


def test_histogram_merges_a_destination_by_code_and_by_name() -> None:
    # "qa" by its code (acks whose plan names it) and by its name (an ack whose plan does
    # not): one latency row per level, its buckets merged.
    pickup = CODES["pickup"]
    rows = [
        {"code1": 1, "key1": None, "bucket": 5, "n": 1, "lo": 5, "hi": 5},
        {"code1": None, "key1": "qa", "bucket": 5, "n": 1, "lo": 5, "hi": 5},
        {"code1": None, "key1": "qa", "bucket": 7, "n": 2, "lo": 7, "hi": 7},
        {"code1": 0, "key1": None, "bucket": 3, "n": 1, "lo": 3, "hi": 3},
    ]
    table = pa.Table.from_pylist(
        [
            {"metric": pickup, "key2": None, "key3": None, "bin": 0, "rows": r["n"], "lo2": None}
            | r
            for r in rows
        ],
        schema=pa.schema(
            [
                ("metric", pa.int8()),
                ("code1", pa.int32()),
                ("key1", pa.string()),
                ("key2", pa.string()),
                ("key3", pa.string()),
                ("bin", pa.int32()),
                ("bucket", pa.int64()),
                ("rows", pa.int64()),
                ("n", pa.int64()),
                ("lo", pa.int64()),
                ("hi", pa.int64()),
                ("lo2", pa.int64()),
                *((name, pa.int64()) for name in COUNTERS),
            ]
        ),
    )
    got = {
        (r["level"], r["destination"]): r for r in Histograms(table, ("a0", "qa")).latency_rows()
    }
    assert set(got) == {("all", None), ("destination", "a0"), ("destination", "qa")} | {
        ("recipient", "a0"),
        ("recipient", "qa"),
    }
    assert got[("destination", "qa")]["acks"] == 4
    assert got[("destination", "qa")]["pickup_p50_ms"] == 0.005
    assert got[("destination", "qa")]["pickup_p99_ms"] == 0.007
    assert got[("all", None)]["acks"] == 5


def test_clock_skew_bounds_per_receiver(audited: dict[str, Any]) -> None:
    got = _by(audited["tables"]["receivers"], "receiver")
    assert got["rA"]["skew_proved"] is False
    assert got["rB"]["behind_by_at_least_ms"] == 2000.0
    assert got["rB"]["ahead_by_at_least_ms"] == 0.0
    assert got["rC"]["ahead_by_at_least_ms"] == 600.0
    assert got["rC"]["behind_by_at_least_ms"] == 0.0
    assert got["rB"]["relay_p50_ms"] == 2010.0


def test_outcome_rates_by_sender_and_over_time(audited: dict[str, Any]) -> None:
    by_sender = _by(audited["tables"]["rates_by_sender"], "sender")
    assert by_sender["s1"]["satisfied"] == 2
    assert by_sender["s1"]["success_rate"] == 1.0
    assert (by_sender["s2"]["violated"], by_sender["s2"]["pending"]) == (2, 1)
    assert by_sender["s2"]["compensation_rate"] == 0.5
    buckets = audited["tables"]["outcomes_over_time"]
    assert [(r["satisfied"], r["violated"], r["pending"]) for r in buckets] == [
        (2, 1, 1),
        (0, 1, 0),
    ]
    assert audited["summary"]["totals"] == {
        "cms": 5,
        "decided": 4,
        "pending": 1,
        "native_cms": 5,
        "shapes": 3,
        "acks": 8,
    }


def test_destination_rates_with_deadline_misses(audited: dict[str, Any]) -> None:
    got = _by(audited["tables"]["destinations"], "destination")
    assert (got["qa"]["pickup_deadlines"], got["qa"]["pickup_misses"]) == (3, 1)
    assert (got["qb"]["pickup_misses"], got["qb"]["process_misses"]) == (1, 1)
    assert (got["qc"]["pickup_deadlines"], got["qc"]["pickup_misses"]) == (1, 0)
    assert got["qa"]["compensated"] == 1
    assert got["qa"]["copies"] == 3


def test_anomaly_tables(audited: dict[str, Any]) -> None:
    tables = audited["tables"]
    orphans = _by(tables["orphan_acks"], "ack_id")
    assert {k: v["source"] for k, v in orphans.items()} == {"a5": "both", "a6": "anomaly"}
    assert [r["ack_id"] for r in tables["duplicate_acks"]] == ["a1"]
    multiple = tables["multiple_consumptions"]
    assert [(r["cm_id"], r["consumer"], r["ack_ids"]) for r in multiple] == [
        ("c4", "", ["a4", "a4b"])
    ]
    late = tables["late_acks"]
    assert [(r["ack_id"], r["after_decision_ms"]) for r in late] == [("a3", 100.0)]
    mismatches = tables["status_mismatches"]
    assert [(r["ack_id"], r["problem"]) for r in mismatches] == [("a8", "counted_after_decision")]
    assert [r["ack_id"] for r in tables["malformed_acks"]] == ["a7"]
    assert [r["cm_id"] for r in tables["stale_pending"]] == ["c4"]
    assert tables["invalid_conditions"] == []
    metrics = audited["summary"]["metrics"]
    assert metrics["counted_after_decision"] == 1
    assert metrics["discrepancies"] == 1


def test_window_is_a_consistent_cut(spark: Any) -> None:
    data = apply_window(_store(spark), Window(until=at(2550), since=T0))
    cms = _by(data.cms.select("cm_id", "state", "decided_at").collect(), "cm_id")
    assert sorted(cms) == ["c1", "c2", "c3", "c4"]  # c5 is sent after the cut
    assert cms["c3"]["state"] == "violated"
    acks = sorted(r["ack_id"] for r in data.acks.collect())
    # a3 is received after the cut, a8 belongs to a CM outside it; the orphan a5 stays.
    assert acks == ["a1", "a2", "a4", "a4b", "a5", "a7"]
    earlier = apply_window(_store(spark), Window(until=at(2400)))
    c3 = earlier.cms.where("cm_id = 'c3'").first()
    assert c3 is not None
    assert (c3["state"], c3["decided_at"], c3["effective_at"]) == ("pending", None, None)
    released = [r["released_at"] for r in earlier.compensations.collect()]
    assert released == [None, None]


def test_colliding_join_keys_change_nothing(
    spark: Any, audited: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joins' one long key is a hash (of the CM id; of the plan and destination; of
    the sender): with every CM given one key, every plan destination another and every
    sender a third, the exact comparisons beside the keys keep them apart, the CMs are
    numbered apart for the per-CM aggregation, and the audit's answers do not change."""
    from pyspark.sql import functions as F

    from spark_audit.transforms import conditions, enrich

    monkeypatch.setattr(enrich, "cm_key", lambda column="cm_id": F.lit(7).alias("cm_key"))
    monkeypatch.setattr(conditions, "leaf_key", lambda plan, destination: F.lit(7).cast("long"))
    monkeypatch.setattr(conditions, "sender_key", lambda column: F.lit(7).cast("long"))
    collided = _audit(spark, tmp_path)

    def canonical(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        return {name: sorted(map(repr, rows)) for name, rows in tables.items()}

    assert canonical(collided["tables"]) == canonical(audited["tables"])
    assert collided["summary"]["metrics"] == audited["summary"]["metrics"]


def test_every_condition_judged_by_evaluate_gives_the_same_audit(
    spark: Any, audited: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no skeleton compiled, ``evaluate`` judges every CM over the cached acks, which
    then keep their text (and the detail tables read them from the cache): the answers
    are those of the compiled path, but for the path each discrepancy names."""
    from spark_audit.transforms import conditions

    monkeypatch.setattr(conditions, "MAX_SKELETONS", 0)
    judged = _audit(spark, tmp_path)

    def canonical(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        return {
            name: sorted(repr({k: v for k, v in row.items() if k != "path"}) for row in rows)
            for name, rows in tables.items()
        }

    assert {r["path"] for r in judged["tables"]["discrepancies"]} == {"python"}
    assert canonical(judged["tables"]) == canonical(audited["tables"])
    assert judged["summary"]["metrics"] == audited["summary"]["metrics"]
    assert judged["summary"]["totals"]["native_cms"] == 0


def test_more_than_64_destinations(spark: Any, tmp_path: Path) -> None:
    """Per-slot flags are bits of 64-slot words: slots past the first word count too."""
    names = [f"q{i}" for i in range(70)]
    condition = DestinationSet(*(Destination(n, pickup_within=s) for n in names))
    cms = [
        cm_row(
            "w1",
            condition,
            state="violated",
            decided_at=at(2100),
            effective_at=at(2000),
        )
    ]
    acks = [
        ack_row("b0", "w1", "q0", read_at=at(500)),
        ack_row("b65", "w1", "q65", read_at=at(1500)),
        ack_row("b69", "w1", "q69", read_at=at(200)),
    ]
    compensations = [
        {"cm_id": "w1", "destination": "q66", "system_generated": True, "released_at": at(2200)}
    ]
    data = AuditInput(
        cms=frame(spark, "cms", cms),
        copies=frame(spark, "copies", []),
        acks=frame(spark, "acks", acks),
        compensations=frame(spark, "compensations", compensations),
        anomalies=frame(spark, "anomalies", []),
        spheres=frame(spark, "spheres", []),
    )
    options = AuditOptions(out=tmp_path, window=Window(until=UNTIL), source="wide")
    result = run_audit(spark, data, options, progress=lambda _m: None)
    table = pq.read_table(tmp_path / "tables" / "destinations").to_pylist()
    got = {r["destination"]: (r["pickup_misses"], r["compensated"]) for r in table}
    assert len(got) == 70
    assert got["q0"] == (0, 0) and got["q69"] == (0, 0)
    assert got["q65"] == (1, 0) and got["q66"] == (1, 1) and got["q1"] == (1, 0)
    assert sum(r["pickup_deadlines"] for r in table) == 70
    assert result.summary["metrics"]["discrepancies"] == 0
