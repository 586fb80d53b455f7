"""The demo's last act: ``condmsg export`` of the sender store to Parquet, then the Spark
audit over it (``python -m spark_audit``, the spark-submit entry point, in a process of its
own so the JVM's output goes to a log), and what the audit found."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from condmsg.cli import main as condmsg_main
from condmsg.demo.stage import Checks
from condmsg.demo.story import Story

#: Audit metrics shown in the demo's summary, in this order.
SHOWN_METRICS = (
    "discrepancies",
    "late_acks",
    "late_acks_changing_verdict",
    "orphan_acks",
    "duplicate_acks",
    "multiple_consumptions",
    "stale_pending",
    "deadline_miss_rate",
    "relay_p99_ms",
)


def export_and_audit(db_url: str, out: Path, story: Story, checks: Checks) -> None:
    store, audit = out / "store", out / "audit"
    story.say(f"\n-- The audit: condmsg export --out {store}, then the Spark audit over it")
    started = time.monotonic()
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):  # per-table progress lines
        code = condmsg_main(["export", "--db-url", db_url, "--out", str(store)])
    if not checks.expect(code == 0, f"export finished (exit code {code})"):
        story.say(errors.getvalue())
        return
    story.say(f"   exported in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    log = out / "audit.log"
    with log.open("wb") as sink:
        args = ["--parquet", str(store), "--out", str(audit)]
        code = subprocess.run(
            [sys.executable, "-m", "spark_audit", *args], stdout=sink, stderr=sink
        ).returncode
    story.say(
        f"   Spark audit took {time.monotonic() - started:.1f} s (exit code {code}; log {log})"
    )
    summary_path = audit / "summary.json"
    if not checks.expect(code in (0, 1) and summary_path.exists(), "the audit wrote its summary"):
        return
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    _show(summary, story)
    metrics = summary["metrics"]
    checks.expect(metrics.get("discrepancies") == 0, "zero discrepancies: every verdict reproduced")
    checks.expect(summary["status"] != "fail", f"audit status {summary['status']} (not fail)")
    story.say(f"   summary: {summary_path.resolve()}")
    story.say(f"   report:  {(audit / 'report.html').resolve()}")


def _show(summary: dict[str, Any], story: Story) -> None:
    totals = summary["totals"]
    story.say(
        f"   audit {summary['status']}: {totals.get('cms')} CMs ({totals.get('decided')} "
        f"decided, {totals.get('pending')} pending), {totals.get('acks')} acks"
    )
    metrics = summary["metrics"]
    shown = [f"{name} {_number(metrics.get(name))}" for name in SHOWN_METRICS]
    story.say(f"   {'; '.join(shown)}")
    for check in summary["checks"]:
        if not check["passed"]:
            story.say(
                f"   {check['severity']} {check['name']}: {_number(check['observed'])} > "
                f"{_number(check['threshold'])} ({check['description']})"
            )


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    return str(int(value))
