"""How ``report.html`` writes a value: counts with thousands separators, durations with
their unit (ms, s, min, h), rates as percentages and instants in ISO 8601 UTC.

The unit of a number follows from its column's name, as in the audit's tables: ``*_ms``
columns are milliseconds and ``*_rate`` columns fractions of one.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape
from typing import Any

#: Shown for a value the audit could not compute (null).
MISSING = "\u2013"  # an en dash


def count(value: float) -> str:
    """``4805`` -> ``4,805``; a fraction keeps two decimals."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}"


#: Each unit a duration is written in: (below this many ms, ms in one unit, name).
_UNITS = (
    (1000.0, 1.0, "ms"),
    (60_000.0, 1000.0, "s"),
    (3_600_000.0, 60_000.0, "min"),
    (math.inf, 3_600_000.0, "h"),
)
#: Decimals of a value below 10 and of a larger one, by unit.
_DECIMALS = {"ms": (1, 0), "s": (2, 1), "min": (1, 1), "h": (1, 1)}


def _scaled(ms: float) -> tuple[float, str]:
    return next((ms / size, unit) for below, size, unit in _UNITS if abs(ms) < below)


def duration_ms(ms: float) -> str:
    """Milliseconds in the largest unit that keeps the value readable: ``565 ms``,
    ``1.38 s``, ``13.5 s``, ``2.1 min``, ``1.5 h``."""
    if ms == 0:
        return "0 ms"
    value, unit = _scaled(ms)
    decimals = _DECIMALS[unit][abs(value) >= 10]
    return f"{value:,.{decimals}f} {unit}"


def short_duration_ms(ms: float) -> str:
    """A chart label: two significant digits (``512 ms``, ``4.1 s``, ``33 s``)."""
    value, unit = _scaled(ms)
    if unit == "ms" or abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:.2g} {unit}"


def rate(fraction: float) -> str:
    """A fraction of one as a percentage: ``0.187`` -> ``18.7 %``, ``0.00104`` -> ``0.10 %``."""
    percent = fraction * 100
    return f"{percent:.1f} %" if percent == 0 or abs(percent) >= 10 else f"{percent:.2f} %"


def instant(value: datetime | str) -> str:
    """ISO 8601 in UTC with a ``Z``; milliseconds only where the instant has them.

    A naive ``datetime`` is one Spark's ``collect`` made: local time of this process."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    utc = value.astimezone(UTC)
    spec = "milliseconds" if utc.microsecond else "seconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def metric(name: str, value: float | None) -> str:
    """A metric or threshold of a check, in the unit its name implies."""
    if value is None:
        return MISSING
    if name.endswith("_rate"):
        return rate(value)
    if name.endswith("_ms"):
        return duration_ms(value)
    return count(value)


def cell(column: str, value: Any) -> tuple[str, str]:
    """``(html, css class)`` of one table cell: ``num`` cells align right, ``text``
    cells wrap anywhere (reasons, JSON, condition shapes), ``none`` is a missing value.
    An id (a UUID, no spaces) stays on one line."""
    if value is None:
        return MISSING, "none"
    if isinstance(value, bool):
        return ("yes" if value else "no"), ""
    if isinstance(value, datetime):
        # A narrow column may break it between the date and the time, nowhere else.
        return instant(value).replace("T", "<wbr>T", 1), "time"
    if isinstance(value, int | float):
        return metric(column, float(value)), "num"
    if isinstance(value, list):
        return escape("; ".join(str(v) for v in value)), "text"
    text = str(value)
    return escape(text), "text" if len(text) > 40 or (" " in text and len(text) > 24) else ""


def heading(column: str) -> str:
    """A column's header: its name without the unit suffix (the values carry it), with
    spaces where the name has underscores so that a narrow header wraps."""
    if column.endswith("_ms"):
        column = column[: -len("_ms")]
    return escape(column.replace("_", " "))
