"""``make bench`` / ``python -m bench``: run every benchmark in ``bench/``, one after another.

Each benchmark measures its own raw baseline in the same run and ends with one JSON line;
this runner prints their output as it comes and, at the end, one table of every figure with
its baseline, ratio and target (the ``"table"`` rows of each JSON line), then every JSON
line again. ``--record`` appends the table, dated and with the commit and the machine's
load, to ``bench/RESULTS.md``, so that a figure that slips is seen beside its history.
Benchmarks run one at a time: on two cores, two at once would measure each other.
Those in ``ON_REQUEST`` run only when named (``python -m bench soak``, ``make soak``): the
soak takes an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ON_REQUEST = ("soak",)
COLUMNS = ("benchmark", "figure", "value", "baseline", "ratio", "target", "ok")


def rows_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows of one benchmark's JSON line: its own ``"table"``, else one row for
    each figure that has a ``..._target`` beside it."""
    name = document["benchmark"]
    if "table" in document:
        return [{"benchmark": name, **r} for r in document["table"]]
    rows = []
    for key, target in document.items():
        subject = key.replace("_target", "")
        if "_target" in key and subject in document and isinstance(target, int | float):
            value = document[subject]
            rows.append({"benchmark": name, "figure": subject, "value": value, "target": target})
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[_cell(r.get(c)) for c in COLUMNS] for r in rows]


def print_table(cells: list[list[str]]) -> None:
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]
    for line in (list(COLUMNS), *cells):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))


def record(cells: list[list[str]], results: Path) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    load = os.getloadavg()[0]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "",
        f"## {when}: `make bench` (commit {commit or 'unknown'}, load {load:.1f})",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(row) + " |" for row in cells),
    ]
    with results.open("a") as f:
        f.write("\n".join(lines) + "\n")


def chosen(asked: list[str]) -> list[str]:
    """The benchmarks to run: those ``asked`` for, else every one but ``ON_REQUEST``."""
    names = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))
    if asked:
        return [n for n in names if n in asked]
    return [n for n in names if n not in ON_REQUEST]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Run the benchmarks (all, or those named).")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all but the soak)")
    parser.add_argument("--record", action="store_true", help="append the table to RESULTS.md")
    args = parser.parse_args(argv)
    names = chosen(args.names)
    summaries: list[str] = []
    failed = []
    for name in names:
        print(f"\n=== bench.{name}", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", f"bench.{name}"], stdout=subprocess.PIPE, text=True
        )
        print(proc.stdout, end="", flush=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            failed.append(name)
            continue
        json.loads(lines[-1])  # each benchmark must end with one valid JSON line
        summaries.append(lines[-1])
    cells = table([r for line in summaries for r in rows_of(json.loads(line))])
    print("\n=== every figure")
    print_table(cells)
    print("\n=== summary")
    for line in summaries:
        print(line)
    if args.record and cells:
        record(cells, HERE / "RESULTS.md")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
