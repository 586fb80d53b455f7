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
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


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


@dataclass(frozen=True, slots=True)
class Row:
    """One line of ``make bench``'s table: a figure, the baseline measured beside it in the
    same run, their ratio and the target the figure is held to (``">= 0.5"`` of the ratio,
    ``"< 25 ms"`` of the value). ``ok`` is None where no target applies."""

    figure: str
    value: float
    unit: str = ""
    baseline: float | None = None
    ratio: float | None = None
    target: str = ""
    ok: bool | None = None


def row(
    figure: str,
    value: float,
    unit: str = "",
    *,
    baseline: float | None = None,
    higher: float | None = None,
    lower: float | None = None,
    ratio_at_least: float | None = None,
) -> Row:
    """A table row; the ratio is ``value / baseline``. The target is one of: the value at
    least ``higher``, below ``lower``, or the ratio at least ``ratio_at_least``."""
    ratio = value / baseline if baseline else None
    if ratio_at_least is not None:
        target, ok = f"ratio >= {ratio_at_least:g}", ratio is not None and ratio >= ratio_at_least
    elif higher is not None:
        target, ok = f">= {higher:g} {unit}".strip(), value >= higher
    elif lower is not None:
        target, ok = f"< {lower:g} {unit}".strip(), value < lower
    else:
        target, ok = "", None
    return Row(
        figure,
        round(value, 3),
        unit,
        None if baseline is None else round(baseline, 3),
        None if ratio is None else round(ratio, 3),
        target,
        ok,
    )


def emit_result(benchmark: str, figures: dict[str, Any], table: Sequence[Row] = ()) -> None:
    """Print the one final JSON line: ``{"benchmark": name, ...figures}``, with ``table``
    (the rows ``make bench`` prints and records) under the key ``"table"``."""
    document = {"benchmark": benchmark, **figures}
    if table:
        document["table"] = [{k: getattr(r, k) for k in Row.__slots__} for r in table]
    print(json.dumps(document, sort_keys=True), flush=True)


@contextmanager
def fresh_pg_schema(pg_url: str, prefix: str = "bench") -> Iterator[str]:
    """A SQLAlchemy URL whose ``search_path`` is a new schema, dropped afterwards."""
    import sqlalchemy as sa  # here, so helpers that need no database import no driver

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def psycopg_conninfo(sa_url: str) -> str:
    """The libpq conninfo of a ``postgresql+psycopg://`` URL (for plain psycopg baselines)."""
    import sqlalchemy as sa

    return sa.make_url(sa_url).set(drivername="postgresql").render_as_string(False)


def delete_queues(amqp_url: str, queue: str, sender_name: str) -> None:
    """Delete a benchmark's destination ``queue`` and the service queues of its sender."""
    import pika  # here, so helpers that need no broker import no client

    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        for name in (queue, *(f"condmsg.{sender_name}.{k}" for k in ("ack", "outcome", "dead"))):
            channel.queue_delete(name)
