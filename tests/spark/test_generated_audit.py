"""On a generated store, the audit finds every injected fault with its exact count and
nothing else; the generator's own stored verdicts agree with ``condmsg.evaluate``."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from condmsg.core.acks import Ack, AckKind
from condmsg.core.condition_codec import condition_from_json
from condmsg.core.conditions import Condition
from condmsg.core.evaluation import evaluate
from spark_audit.cli import EXIT_FAILED, main
from spark_audit.generate import Injected, generate
from spark_audit.generate_spec import GenerateSpec
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

SKEWED = {"rcv-qb": -3000, "rcv-w2": 2000}
SPEC = GenerateSpec(
    cms=2500,
    seed=11,
    wrong_verdicts=7,
    late_harmless=3,
    late_changing=4,
    duplicates=5,
    orphans=6,
    multiple_consumptions=8,
    stale_pending=2,
    skewed_receivers=SKEWED,
)


@pytest.fixture(scope="session")
def audited(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("generated")
    injected = generate(spark, SPEC, root / "store")
    code = main(["--parquet", str(root / "store"), "--out", str(root / "audit"), "--quiet"])
    summary = json.loads((root / "audit" / "summary.json").read_text())
    return {"root": root, "injected": injected, "code": code, "summary": summary}


def test_injected_counts_are_recorded(audited: dict[str, Any]) -> None:
    injected: Injected = audited["injected"]
    recorded = json.loads((audited["root"] / "store" / "injected.json").read_text())
    assert recorded["wrong_verdicts"] == injected.wrong_verdicts == 7
    assert injected.acks > 4000


def test_every_injected_fault_is_found_exactly(audited: dict[str, Any]) -> None:
    metrics = audited["summary"]["metrics"]
    assert {
        "discrepancies": metrics["discrepancies"],
        "late_acks": metrics["late_acks"],
        "late_acks_changing_verdict": metrics["late_acks_changing_verdict"],
        "late_ack_flag_mismatches": metrics["late_ack_flag_mismatches"],
        "orphan_acks": metrics["orphan_acks"],
        "duplicate_acks": metrics["duplicate_acks"],
        "multiple_consumptions": metrics["multiple_consumptions"],
        "stale_pending": metrics["stale_pending"],
        "counted_after_decision": metrics["counted_after_decision"],
        "not_counted_before_decision": metrics["not_counted_before_decision"],
        "not_counted_while_pending": metrics["not_counted_while_pending"],
        "malformed_acks": metrics["malformed_acks"],
        "invalid_conditions": metrics["invalid_conditions"],
    } == {
        "discrepancies": 7,
        "late_acks": 3 + 4,
        "late_acks_changing_verdict": 4,
        "late_ack_flag_mismatches": 0,
        "orphan_acks": 6,
        "duplicate_acks": 5,
        "multiple_consumptions": 8,
        "stale_pending": 2,
        "counted_after_decision": 0,
        "not_counted_before_decision": 0,
        "not_counted_while_pending": 0,
        "malformed_acks": 0,
        "invalid_conditions": 0,
    }


def test_discrepancies_carry_evidence(audited: dict[str, Any]) -> None:
    table = pq.read_table(audited["root"] / "audit" / "tables" / "discrepancies").to_pylist()
    assert len(table) == 7
    for row in table:
        assert row["stored_verdict"] != row["recomputed_verdict"]
        assert row["python_verdict"] == row["recomputed_verdict"]
        assert row["reasons"]


def test_exactly_the_skewed_receivers_are_proven_skewed(audited: dict[str, Any]) -> None:
    receivers = pq.read_table(audited["root"] / "audit" / "tables" / "receivers").to_pylist()
    proved = {r["receiver"]: r for r in receivers if r["skew_proved"]}
    assert set(proved) == set(SKEWED)
    behind = proved["rcv-qb"]["behind_by_at_least_ms"]
    ahead = proved["rcv-w2"]["ahead_by_at_least_ms"]
    assert 0 < behind <= 3000
    assert 0 < ahead <= 2000


def test_exit_code_status_and_outputs(audited: dict[str, Any]) -> None:
    summary = audited["summary"]
    assert audited["code"] == EXIT_FAILED
    assert summary["status"] == "fail"
    assert (summary["schema"], summary["version"]) == ("condmsg.audit.summary", 1)
    failed = {c["name"] for c in summary["checks"] if not c["passed"]}
    assert "verdicts_reproducible" in failed
    assert summary["totals"]["cms"] == SPEC.cms
    html = (audited["root"] / "audit" / "report.html").read_text()
    assert "<svg" in html
    assert "<script" not in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    for name in summary["tables"]:
        assert (audited["root"] / "audit" / "tables" / name).is_dir()


def test_generated_stored_verdicts_agree_with_evaluate(audited: dict[str, Any]) -> None:
    store = audited["root"] / "store"
    cms = pq.read_table(store / "cms").to_pylist()
    acks: dict[str, list[Ack]] = defaultdict(list)
    for row in pq.read_table(store / "acks").to_pylist():
        if row["status"] == "counted":
            acks[row["cm_id"]].append(
                Ack(
                    destination=row["destination"],
                    kind=AckKind(row["kind"]),
                    read_at=row["read_at"],
                    committed_at=row["committed_at"],
                    recipient=row["recipient"],
                )
            )
    conditions: dict[str, Condition] = {}
    disagreeing = 0
    decided = 0
    for cm in cms:
        if cm["state"] == "pending":
            continue
        decided += 1
        text = cm["condition_json"]
        condition = conditions.setdefault(text, condition_from_json(text))
        at = cm["effective_at"].astimezone(UTC)
        result = evaluate(condition, cm["sent_at"], acks[cm["cm_id"]], at)
        disagreeing += result.verdict.value != cm["state"]
    assert decided > 2000
    assert disagreeing == SPEC.wrong_verdicts


def test_bad_input_exits_with_2(tmp_path: Path) -> None:
    assert main(["--parquet", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2


def test_the_notebook_api_returns_frames_and_writes_nothing(
    spark: Any, audited: dict[str, Any]
) -> None:
    import spark_audit
    from spark_audit.job import JOB_GROUP

    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(JOB_GROUP))
    run = spark_audit.audit(spark, str(audited["root"] / "store"))
    # Its jobs are listed under the audit's group in Spark's UI.
    assert set(tracker.getJobIdsForGroup(JOB_GROUP)) - before
    assert run.status == "fail"
    assert run.summary["metrics"] == audited["summary"]["metrics"]
    cms = run.cms.cache()
    try:
        assert cms.count() == SPEC.cms
        wrong = cms.where("decided AND NOT agrees").select("cm_id", "sender", "shape").collect()
        assert len(wrong) == SPEC.wrong_verdicts
        assert all(r["cm_id"] and r["sender"] and r["shape"] for r in wrong)
        assert cms.where("stale").count() == SPEC.stale_pending
    finally:
        cms.unpersist()
    assert set(run.tables) == set(audited["summary"]["tables"])
    assert run.tables["orphan_acks"].count() == SPEC.orphans
    assert run.tables["discrepancies"].count() == SPEC.wrong_verdicts
