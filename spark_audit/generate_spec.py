"""What a synthetic history is made of (:class:`GenerateSpec`) and the deterministic
randomness (:func:`uniform`) that both halves of the generator draw from:
:mod:`spark_audit.generate` (the natural history) and :mod:`spark_audit.generate_inject`
(the injected faults).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_audit.templates import Template, default_templates

_TWO53 = float(2**53)


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateSpec:
    cms: int
    seed: int = 7
    start: datetime = datetime(2025, 1, 1, tzinfo=UTC)
    interval_ms: int = 100
    senders: int = 5
    tail_ms: int = 10_000
    ack_grace_ms: int = 250
    templates: tuple[Template, ...] = field(default_factory=default_templates)
    wrong_verdicts: int = 0
    late_harmless: int = 0
    late_changing: int = 0
    duplicates: int = 0
    orphans: int = 0
    multiple_consumptions: int = 0
    stale_pending: int = 0
    skewed_receivers: Mapping[str, int] = field(default_factory=dict)
    partitions: int | None = None

    @property
    def until(self) -> datetime:
        return self.start + timedelta(milliseconds=self.cms * self.interval_ms + self.tail_ms)


def uniform(*parts: Column | int) -> Column:
    """A deterministic uniform double in [0, 1) from a hash of ``parts``."""
    columns = [p if isinstance(p, Column) else F.lit(p) for p in parts]
    return F.pmod(F.xxhash64(*columns), F.lit(2**53)).cast("double") / F.lit(_TWO53)
