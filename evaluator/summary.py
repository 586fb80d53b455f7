"""The evaluator's periodic summary: one INFO line, every ``config.summary_interval_s``,
saying how many CMs it decided since the last line, how many are pending and how many are
overdue, so that a log read at INFO shows the service at work (or stuck) without metrics.

The decisions come from the service's own counter (this instance and its intake workers);
pending and overdue from the gauges' store query, one pass over the partial index on
``next_check_at`` that holds the pending CMs only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from evaluator.gauges import ServiceGauges
from evaluator.metrics import EvaluatorMetrics

log = logging.getLogger("evaluator.summary")


class DecisionSummary:
    """Logs the summary line of ``metrics`` and ``gauges`` each time :meth:`log` runs."""

    def __init__(
        self,
        metrics: EvaluatorMetrics,
        gauges: ServiceGauges,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._gauges = gauges
        self._clock = clock
        self._since = clock()
        self._counted = self._decided()

    def _decided(self) -> dict[str, int]:
        """CMs decided so far, by verdict."""
        counts: dict[str, int] = {}
        for family in self._metrics.decisions.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["verdict"]] = int(sample.value)
        return counts

    def log(self) -> None:
        self._gauges.refresh_store()  # the figures as of now, not of the last refresh
        now, counted = self._clock(), self._decided()
        decided = {v: n - self._counted.get(v, 0) for v, n in counted.items()}
        decided = {v: n for v, n in decided.items() if n}
        total = sum(decided.values())
        by_verdict = ", ".join(f"{n} {v}" for v, n in sorted(decided.items()))
        pending, overdue = self._gauges.pending, self._gauges.overdue
        log.info(
            "decided %d CMs in the last %.0f s%s; %s pending, %s overdue",
            total,
            now - self._since,
            f" ({by_verdict})" if by_verdict else "",
            "?" if pending is None else pending,
            "?" if overdue is None else overdue,
            extra={"decided": total, "pending": pending, "overdue": overdue},
        )
        self._since, self._counted = now, counted
