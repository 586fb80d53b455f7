"""Helpers shared by the benchmarks: timing, percentiles, the final JSON line.

Every benchmark measures its own raw baseline in the same run (absolute figures drift
between machines) and ends with exactly one JSON line holding every figure, so that a
runner can collect results with ``json.loads(output.splitlines()[-1])``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Stopwatch:
    """Elapsed wall-clock seconds of a ``with timed() as sw:`` block (``sw.seconds``)."""

    started: float = 0.0
    seconds: float = 0.0


@contextmanager
def timed() -> Iterator[Stopwatch]:
    sw = Stopwatch(started=time.perf_counter())
    try:
        yield sw
    finally:
        sw.seconds = time.perf_counter() - sw.started


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def log(message: str) -> None:
    """A human-readable progress line (stderr keeps stdout's last line the JSON)."""
    print(message, file=sys.stderr, flush=True)


def emit_result(benchmark: str, figures: dict[str, Any]) -> None:
    """Print the one final JSON line: ``{"benchmark": name, ...figures}``."""
    print(json.dumps({"benchmark": benchmark, **figures}, sort_keys=True), flush=True)
