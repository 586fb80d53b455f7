"""The audit's ``late_ack_effects`` for late evidence that changes a verdict only as a
whole: two late COMMIT acks, each committed in time, that satisfy ``min_process=2``
together. The evaluator judges late acks cumulatively and labels the second
``changes_verdict``; the audit (which judges with every ack) agrees with that label, and
reports the mismatch if the acks are labelled one by one (both ``after_decision``)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from condmsg.core.conditions import Destination, DestinationSet
from spark_audit.job import AuditOptions, run_audit
from spark_audit.readers import AuditInput, Window
from tests.spark.builders import ack_row, at, cm_row, frame
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)


def _store(spark: Any, second_status: str) -> AuditInput:
    condition = DestinationSet(
        Destination("qa"),
        Destination("qb"),
        Destination("qc"),
        process_within=timedelta(seconds=10),
        min_process=2,
    )
    cms = [
        cm_row(
            "c1",
            condition,
            state="violated",
            decided_at=at(10_300),
            effective_at=at(10_050),
        )
    ]
    acks = [
        ack_row(
            "a1",
            "c1",
            "qa",
            read_at=at(1_000),
            committed_at=at(2_000),
            received_at=at(11_000),
            status="after_decision",
        ),
        ack_row(
            "a2",
            "c1",
            "qb",
            read_at=at(1_500),
            committed_at=at(2_500),
            received_at=at(12_000),
            status=second_status,
        ),
    ]
    return AuditInput(
        cms=frame(spark, "cms", cms),
        copies=frame(spark, "copies", []),
        acks=frame(spark, "acks", acks),
        compensations=frame(spark, "compensations", []),
        anomalies=frame(spark, "anomalies", []),
        spheres=frame(spark, "spheres", []),
    )


@pytest.mark.parametrize(
    ("second_status", "flagged", "mismatches"),
    [
        ("changes_verdict", True, 0),  # judged cumulatively, as the evaluator does
        ("after_decision", False, 1),  # judged one by one: the audit reports it
    ],
)
def test_two_late_commits_that_satisfy_a_minimum_together(
    spark: Any, tmp_path: Path, second_status: str, flagged: bool, mismatches: int
) -> None:
    options = AuditOptions(
        out=tmp_path, window=Window(until=at(60_000)), source="handmade", bucket_seconds=3600
    )
    result = run_audit(spark, _store(spark, second_status), options, progress=lambda _m: None)
    effects = pq.read_table(tmp_path / "tables" / "late_ack_effects").to_pylist()
    assert effects == [
        {
            "cm_id": "c1",
            "late_acks": 2,
            "stored_verdict": "violated",
            "verdict_counted": "violated",
            "verdict_with_late": "satisfied",
            "changes_verdict": True,
            "flagged": flagged,
        }
    ]
    metrics = result.summary["metrics"]
    assert metrics["late_acks_changing_verdict"] == 1
    assert metrics["late_ack_flag_mismatches"] == mismatches
