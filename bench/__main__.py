"""``make bench`` / ``python -m bench``: run every benchmark in ``bench/``, one after another.

Each benchmark measures its own raw baseline in the same run and ends with one JSON line;
this runner prints their output as it comes and, at the end, every JSON line again.
Benchmarks run one at a time: on two cores, two at once would measure each other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(p.stem for p in here.glob("*.py") if not p.stem.startswith("_"))
    if argv:
        names = [n for n in names if n in argv]
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
    print("\n=== summary")
    for line in summaries:
        print(line)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
