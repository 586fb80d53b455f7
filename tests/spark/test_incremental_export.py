"""``condmsg export`` by day, appended window by window, and the audit of one window
reading only that window's day partitions; locations as ``file://`` URIs."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from condmsg import tables as st
from condmsg.cli import main as condmsg_main
from condmsg.core.conditions import Destination
from condmsg.runtime import migrate
from spark_audit.cli import main as audit_main
from spark_audit.readers import Window, read_parquet
from spark_audit.settings import session_settings
from tests.spark.builders import T0, ack_row, cm_row
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

DAY = timedelta(days=1)
#: Three days of CMs: the first export covers day 0, the second days 1 and 2.
DAYS = 3
PER_DAY = 4
SECOND = T0 + DAY
END = T0 + DAYS * DAY


def _fill(url: str) -> None:
    engine = sa.create_engine(url)
    migrate.upgrade(engine, "sender")  # export refuses a store without its schema
    condition = Destination("qa", pickup_within=timedelta(hours=1))
    cms, acks = [], []
    for day in range(DAYS):
        for n in range(PER_DAY):
            sent = T0 + day * DAY + timedelta(hours=n + 1)
            cm_id = f"d{day}-{n}"
            decided = sent + timedelta(minutes=5)
            cms.append(
                cm_row(
                    cm_id,
                    condition,
                    sent_at=sent,
                    state="satisfied",
                    decided_at=decided,
                    effective_at=sent + timedelta(minutes=1),
                )
            )
            acks.append(ack_row(f"a-{cm_id}", cm_id, "qa", read_at=sent + timedelta(minutes=1)))
    with engine.begin() as conn:
        conn.execute(st.cms.insert(), cms)
        conn.execute(st.acks.insert(), acks)
    engine.dispose()


def _export(url: str, out: str, *args: str) -> None:
    assert condmsg_main(["export", "--db-url", url, "--out", out, *args]) == 0


def _scanned_files(frame: Any) -> int:
    """Files the frame's scans read: the ``numFiles`` metric of each file scan in its
    executed plan, after computing it (without adaptive execution, which would hide the
    scans inside a plan of its own)."""
    with session_settings(frame.sparkSession, {"spark.sql.adaptive.enabled": "false"}):
        frame.collect()
        plan = frame._jdf.queryExecution().executedPlan()
    leaves = plan.collectLeaves()
    total = 0
    for i in range(leaves.length()):
        metrics = leaves.apply(i).metrics()
        if metrics.contains("numFiles"):
            total += int(metrics.apply("numFiles").value())
    return total


def test_two_windows_exported_then_the_second_audited_from_its_days_only(
    spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    _fill(sqlite_url)
    root = tmp_path / "export"
    out = root.as_uri()
    _export(sqlite_url, out, "--until", SECOND.isoformat())
    _export(sqlite_url, out, "--since", SECOND.isoformat(), "--until", END.isoformat())
    manifest = json.loads((root / "_manifest.json").read_text())
    days = [(T0 + d * DAY).date().isoformat() for d in range(DAYS)]
    assert sorted(manifest["days"]["cms"]) == days
    assert manifest["tables"]["cms"] == DAYS * PER_DAY
    assert [e["since"] for e in manifest["exports"]] == [None, SECOND.isoformat()]
    assert manifest["until"] == END.isoformat()

    # Exporting the second window again replaces its days rather than adding to them.
    _export(sqlite_url, out, "--since", SECOND.isoformat(), "--until", END.isoformat())
    whole = read_parquet(spark, out)
    assert whole.cms.count() == DAYS * PER_DAY
    assert whole.acks.count() == DAYS * PER_DAY

    second = Window(since=SECOND, until=END)
    data = read_parquet(spark, out, second)
    assert _scanned_files(data.cms) == DAYS - 1
    assert _scanned_files(data.acks) == DAYS - 1
    assert _scanned_files(read_parquet(spark, out).cms) == DAYS

    # The first window's files made unreadable: the audit of the second never opens them.
    for table in ("cms", "acks"):
        for part in root.glob(f"{table}/*={T0.date().isoformat()}/*.parquet"):
            part.write_bytes(b"not parquet")
    audit = tmp_path / "audit"
    code = audit_main(
        ["--parquet", out, "--out", audit.as_uri(), "--since", SECOND.isoformat(), "--quiet"]
    )
    summary = json.loads((audit / "summary.json").read_text())
    assert code == 0, summary["checks"]
    assert summary["totals"]["cms"] == (DAYS - 1) * PER_DAY
    assert summary["totals"]["acks"] == (DAYS - 1) * PER_DAY
    assert summary["metrics"]["discrepancies"] == 0


def test_an_append_that_would_leave_a_gap_is_refused(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill(sqlite_url)
    out = str(tmp_path / "export")
    _export(sqlite_url, out, "--until", SECOND.isoformat())
    later = (SECOND + DAY).isoformat()
    code = condmsg_main(["export", "--db-url", sqlite_url, "--out", out, "--since", later])
    assert code == 2
    assert "the days between would be missing" in capsys.readouterr().err
